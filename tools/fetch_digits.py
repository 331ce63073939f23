#!/usr/bin/env python
"""Copy the 8x8 handwritten digits out of a scikit-learn wheel into deepgp_gi/data/digits/.

scikit-learn ships the UCI "Optical Recognition of Handwritten Digits" test set (1,797 images
of 8x8 pixels with values 0..16, and their labels 0..9) as ``sklearn/datasets/data/digits.csv.gz``,
described in ``sklearn/datasets/descr/digits.rst``. This script downloads the scikit-learn wheel
with ``pip download scikit-learn --no-deps`` (or reads a wheel given with ``--wheel``), opens it as
the zip file it is, and writes

* ``digits.csv.gz``: the data file, byte for byte as in the wheel (one image a line: 64 pixel
  values, row-major, then the label),
* ``digits.rst``: scikit-learn's description of the data set, byte for byte,
* ``LICENSE.md``: where the files came from (scikit-learn version, wheel name and SHA-256, the
  files' SHA-256), scikit-learn's BSD-3-Clause licence text from the wheel's ``.dist-info``, and
  the original data set's source and licence.

scikit-learn is never imported and is not a dependency of deepgp_gi. Both files are checked
against the SHA-256 listed in the wheel's ``RECORD``, and the CSV is checked to hold 1,797 rows
of 64 integer pixels in 0..16 and a label in 0..9.

Usage::

    python tools/fetch_digits.py [--wheel scikit_learn-....whl] [--version 1.9.1]
                                 [--dst deepgp_gi/data/digits]
"""

from __future__ import annotations

import argparse
import gzip
import io
import sys
import tempfile
import zipfile
from email.parser import HeaderParser
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import wheels  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA = "sklearn/datasets/data/digits.csv.gz"
DESCR = "sklearn/datasets/descr/digits.rst"
N_IMAGES, N_PIXELS = 1797, 64
UCI_PAGE = "https://archive.ics.uci.edu/dataset/80/optical+recognition+of+handwritten+digits"


def download_wheel(directory: Path, version: str | None) -> Path:
    """``pip download scikit-learn[==version] --no-deps --only-binary=:all: -d directory``."""
    return wheels.download_wheel("scikit-learn" + (f"=={version}" if version else ""), "scikit_learn-*.whl",
                                 directory)


def _bsd_text(copying: str) -> str:
    """The scikit-learn part of COPYING: binary wheels append the licences of bundled libraries
    (e.g. the GCC runtime) after a ``----`` line; those cover compiled code, not the data."""
    text = copying.split("\n----\n", 1)[0].strip()
    if not text.startswith("BSD 3-Clause License"):
        raise RuntimeError("the wheel's COPYING does not start with the BSD 3-Clause licence:\n"
                           + text[:300])
    return text


def check_csv(raw_gz: bytes) -> dict[int, int]:
    """Check the data file's layout; return the number of images per label."""
    lines = gzip.decompress(raw_gz).decode("ascii").splitlines()
    if len(lines) != N_IMAGES:
        raise RuntimeError(f"{DATA}: {len(lines)} rows, expected {N_IMAGES}")
    counts: dict[int, int] = {}
    for i, line in enumerate(lines):
        values = [int(v) for v in line.split(",")]
        if len(values) != N_PIXELS + 1:
            raise RuntimeError(f"{DATA}: row {i} has {len(values)} values, expected {N_PIXELS + 1}")
        if not all(0 <= v <= 16 for v in values[:-1]) or not 0 <= values[-1] <= 9:
            raise RuntimeError(f"{DATA}: row {i} has a pixel outside 0..16 or a label outside 0..9")
        counts[values[-1]] = counts.get(values[-1], 0) + 1
    return dict(sorted(counts.items()))


def extract(wheel: Path, dst: Path) -> None:
    wheel_bytes = wheel.read_bytes()
    with zipfile.ZipFile(io.BytesIO(wheel_bytes)) as z:
        names = z.namelist()
        dist_info = sorted({n.split("/", 1)[0] for n in names
                            if n.split("/", 1)[0].endswith(".dist-info")})
        if len(dist_info) != 1 or not dist_info[0].startswith("scikit_learn-"):
            raise RuntimeError(f"{wheel.name} is not a scikit-learn wheel (dist-info: {dist_info})")
        dist_info = dist_info[0]
        meta = HeaderParser().parsestr(z.read(f"{dist_info}/METADATA").decode("utf-8"))
        name, version = meta["Name"], meta["Version"]
        licence_expr = meta.get("License-Expression") or meta.get("License") or "(not stated)"
        copying_path = next((p for p in (f"{dist_info}/licenses/COPYING", f"{dist_info}/COPYING")
                             if p in names), None)
        if copying_path is None:
            raise RuntimeError(f"no COPYING in {dist_info} of {wheel.name}")
        bsd = _bsd_text(z.read(copying_path).decode("utf-8"))
        record = wheels.record_hashes(z.read(f"{dist_info}/RECORD").decode("utf-8"))
        files = {}
        for member in (DATA, DESCR):
            data = z.read(member)
            if record.get(member) != wheels.sha256(data):
                raise RuntimeError(f"{member}: SHA-256 {wheels.sha256(data)} differs from the wheel's "
                                   f"RECORD ({record.get(member)})")
            files[member] = data

    counts = check_csv(files[DATA])
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "digits.csv.gz").write_bytes(files[DATA])
    (dst / "digits.rst").write_bytes(files[DESCR])
    (dst / "LICENSE.md").write_text(_licence_note(
        name=name, version=version, licence_expr=licence_expr, wheel=wheel.name,
        wheel_sha=wheels.sha256(wheel_bytes), copying_path=copying_path, bsd=bsd,
        data_sha=wheels.sha256(files[DATA]), descr_sha=wheels.sha256(files[DESCR]), counts=counts,
    ), encoding="utf-8")
    print(f"wrote {dst}/digits.csv.gz, digits.rst, LICENSE.md from {wheel.name} "
          f"({name} {version}); images per label: {counts}")


def _licence_note(*, name, version, licence_expr, wheel, wheel_sha, copying_path, bsd,
                  data_sha, descr_sha, counts) -> str:
    counts_text = ", ".join(f"{k}: {v}" for k, v in counts.items())
    return f"""\
# Bundled 8x8 handwritten digits: source and licence

This folder holds the 8x8 handwritten digits used by `deepgp_gi.datasets.load_digits`.
It was written by `tools/fetch_digits.py`; do not edit it by hand.

| file | what | SHA-256 |
|---|---|---|
| `digits.csv.gz` | 1,797 images, one a line: 64 pixel values (0..16, row-major 8x8), then the label (0..9) | `{data_sha}` |
| `digits.rst` | scikit-learn's description of the data set | `{descr_sha}` |

Images per label: {counts_text}.

## Where the files come from

Both files are copied byte for byte, unchanged, out of the {name} {version} wheel
`{wheel}` (SHA-256 `{wheel_sha}`), obtained with
`pip download scikit-learn --no-deps`: `{DATA}` and `{DESCR}`. Their SHA-256 match the wheel's
`RECORD`. scikit-learn itself is neither imported nor required by deepgp_gi.

The data are the test set (`optdigits.tes`, 1,797 images written by 13 people) of the
**Optical Recognition of Handwritten Digits** data set by E. Alpaydin and C. Kaynak
(Department of Computer Engineering, Bogazici University, July 1998), from the UCI Machine
Learning Repository: {UCI_PAGE}. The 8x8 images count the "on" pixels in 4x4 blocks of 32x32
bitmaps extracted with NIST's preprocessing programs (see `digits.rst`).

## Licences

* **The data set:** the UCI Machine Learning Repository distributes the Optical Recognition of
  Handwritten Digits data set under the Creative Commons Attribution 4.0 International licence
  (CC BY 4.0, https://creativecommons.org/licenses/by/4.0/). If you use these data, credit the
  creators and the repository, e.g. *E. Alpaydin and C. Kaynak (1998). Optical Recognition of
  Handwritten Digits. UCI Machine Learning Repository*, and the references in `digits.rst`.
* **The scikit-learn files** (the CSV packaging and `digits.rst`) come from scikit-learn, whose
  licence ({licence_expr}) is reproduced below from `{copying_path}` in the wheel. (Binary
  wheels append the licences of bundled compiled libraries after this text; those cover code
  that is not copied here.)

These files are **not** covered by the Apache-2.0 licence of the deepgp_gi source code.

## scikit-learn licence

```
{bsd}
```
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", type=Path, help="a scikit-learn wheel to read instead of downloading one")
    parser.add_argument("--version", help="scikit-learn version to download (default: the newest pip finds)")
    parser.add_argument("--dst", type=Path, default=REPO_ROOT / "deepgp_gi" / "data" / "digits")
    args = parser.parse_args(argv)
    if args.wheel is not None:
        extract(args.wheel, args.dst)
        return
    with tempfile.TemporaryDirectory() as tmp:
        extract(download_wheel(Path(tmp), args.version), args.dst)


if __name__ == "__main__":
    main()
