"""What the fetch scripts share: downloading one wheel with pip (nothing installed) and reading the
SHA-256 of its files from its ``RECORD``."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import subprocess
import sys
from pathlib import Path

__all__ = ["download_wheel", "record_hashes", "sha256"]


def download_wheel(spec: str, pattern: str, directory: Path) -> Path:
    """``pip download <spec> --no-deps --only-binary=:all: -d directory``; the one wheel in
    ``directory`` whose name matches ``pattern`` (a glob)."""
    cmd = [sys.executable, "-m", "pip", "download", spec, "--no-deps", "--only-binary=:all:", "-d", str(directory)]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    wheels = sorted(directory.glob(pattern))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one wheel {pattern} in {directory}, found {wheels}")
    return wheels[0]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def record_hashes(record: str) -> dict:
    """path -> hex SHA-256 from a wheel ``RECORD`` (which stores urlsafe base64 without padding)."""
    out = {}
    for row in csv.reader(io.StringIO(record)):
        if len(row) >= 2 and row[1].startswith("sha256="):
            b64 = row[1][len("sha256="):]
            out[row[0]] = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
    return out
