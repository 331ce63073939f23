"""Image classification data: the bundled 8x8 handwritten digits, and readers for MNIST and
CIFAR-10.

Each loader returns a :class:`~deepgp_gi.datasets.UCIDataset` with inputs ``[N, H, W, C]`` in
[0, 1] and integer class labels ``[N, 1]``. The digits are bundled as ``deepgp_gi/data/digits/``
(see ``LICENSE.md`` there), with 20 seeded stratified splits (:func:`load_digits`);
:func:`read_mnist_idx` and :func:`load_cifar10` read files the user already has: nothing is
downloaded (:func:`~deepgp_gi.datasets.load_mnist` also reads the arrays ``tools/fetch_mnist.py``
fetches, see :mod:`.mnist`). :func:`standardise_images` is the input scaling of the image
benchmarks.

Plain NumPy (float64); nothing here touches TensorFlow.
"""

from __future__ import annotations

import codecs
import gzip
import pickle
import struct
from pathlib import Path

import numpy as np

from .base import DATA_DIR, PathLike, UCIDataset, check_split_range

__all__ = [
    "DIGITS_SPLITS",
    "load_digits",
    "load_digits_raw",
    "standardise_images",
    "digits_split",
    "read_mnist_idx",
    "load_cifar10",
]

_DIGITS_FILE = DATA_DIR / "digits" / "digits.csv.gz"

#: Number of train/test splits of :func:`load_digits`.
DIGITS_SPLITS = 20
_DIGITS_TEST = 297


def image_dataset(name, split, n_splits, X_train, Y_train, X_test, Y_test, max_value) -> UCIDataset:
    """Pixels ``[0, max_value]`` -> [0, 1] float64 (in place where the input is float64 already);
    labels -> float64 ``[N, 1]``."""

    def scale(X):
        X = np.asarray(X, dtype=np.float64)
        X /= max_value
        return X

    def labels(Y):
        return np.asarray(Y, dtype=np.float64).reshape(-1, 1)

    return UCIDataset(
        name=name,
        split=split,
        X_train=scale(X_train),
        Y_train=labels(Y_train),
        X_test=scale(X_test),
        Y_test=labels(Y_test),
        x_mean=np.array(0.0),
        x_std=np.array(float(max_value)),
        y_mean=0.0,
        y_std=1.0,
        n_splits=n_splits,
    )


def load_digits_raw() -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 bundled 8x8 handwritten digits, in file order, un-normalised.

    The data are the test set of the UCI "Optical Recognition of Handwritten Digits" data set
    (Alpaydin & Kaynak, 1998) as shipped by scikit-learn; see
    ``deepgp_gi/data/digits/LICENSE.md`` for the source and licence (CC BY 4.0).

    :returns: ``(X, Y)``: X [1797, 8, 8, 1] float64 pixel counts 0..16 (row-major images),
        Y [1797, 1] float64 labels 0..9.
    """
    with gzip.open(_DIGITS_FILE, "rt", encoding="ascii") as f:
        data = np.loadtxt(f, delimiter=",", dtype=np.float64, ndmin=2)
    return data[:, :64].reshape(-1, 8, 8, 1), data[:, 64:]


def digits_split(split: int) -> tuple[np.ndarray, np.ndarray]:
    """Row indices of split ``split`` of :func:`load_digits`: 1,500 training and 297 test images.

    Stratified by label: for each label ``c = 0, ..., 9`` in turn, that label's rows (in file
    order) are permuted with ``numpy.random.default_rng(split).permutation`` (one generator for
    all labels) and the first ``t_c`` go to the test set, where the ``t_c`` are ``297 * n_c / 1797``
    rounded by largest remainder (ties to the smaller label) so that they sum to 297. Every split
    therefore has each label in the same proportion (29 or 30 test images per label).

    :param split: split number, ``0 <= split < DIGITS_SPLITS`` (20).
    :returns: ``(train, test)`` row indices into :func:`load_digits_raw`, each sorted.
    :raises TypeError: split is not an integer.
    :raises ValueError: split is out of range.
    """
    split = check_split_range(split, "digits", DIGITS_SPLITS)
    labels = load_digits_raw()[1][:, 0].astype(np.int64)
    return _stratified_split(labels, _DIGITS_TEST, split)


def _stratified_split(labels: np.ndarray, n_test: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    classes, counts = np.unique(labels, return_counts=True)
    quota = n_test * counts / counts.sum()
    take = np.floor(quota).astype(np.int64)
    extra = np.argsort(-(quota - take), kind="stable")[: n_test - take.sum()]
    take[extra] += 1
    rng = np.random.default_rng(seed)
    test = np.concatenate(
        [rng.permutation(np.flatnonzero(labels == c))[:t] for c, t in zip(classes, take)]
    )
    test = np.sort(test)
    train = np.setdiff1d(np.arange(len(labels)), test)
    return train, test


def standardise_images(X_train: np.ndarray, X_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(X - m) / s`` for both arrays with one mean ``m`` and one standard deviation ``s`` of
    ``X_train`` (all pixels and channels together), the inputs of the image benchmarks."""
    mean, std = float(np.mean(X_train)), float(np.std(X_train))
    if not (np.isfinite(std) and std > 0):
        raise ValueError(f"X_train must have a positive, finite standard deviation, got {std}")
    return (X_train - mean) / std, (X_test - mean) / std


def load_digits(split: int = 0) -> UCIDataset:
    """One train/test split of the bundled 8x8 handwritten digits (10 classes), scaled to [0, 1].

    1,797 images (174 to 183 per digit): the test set of the UCI "Optical Recognition of
    Handwritten Digits" data set (Alpaydin & Kaynak, 1998, CC BY 4.0) as shipped by
    scikit-learn, bundled in ``deepgp_gi/data/digits/`` (sources and licences in ``LICENSE.md``
    there). Each split puts 1,500 images in the training set and 297 (about 1/6) in the test
    set, stratified by label (:func:`digits_split`); the splits are fixed by their number.

    The pixel counts 0..16 are divided by 16 (``x_mean = 0``, ``x_std = 16``); the targets are
    the labels 0..9 as float64 in one column (``y_mean = 0``, ``y_std = 1``), which is what a
    :class:`~deepgp_gi.DeepGP` or :func:`~deepgp_gi.build_bnn` with
    ``gpflow.likelihoods.Softmax(10)`` takes (it casts them to integers). Rows keep file order.

    :param split: split number, ``0 <= split < DIGITS_SPLITS`` (20).
    :returns: A :class:`UCIDataset` named ``"digits"`` with X_train [1500, 8, 8, 1],
        Y_train [1500, 1], X_test [297, 8, 8, 1], Y_test [297, 1], all float64.
    :raises TypeError: split is not an integer.
    :raises ValueError: split is out of range.
    """
    split = check_split_range(split, "digits", DIGITS_SPLITS)
    X, Y = load_digits_raw()
    train, test = _stratified_split(Y[:, 0].astype(np.int64), _DIGITS_TEST, split)
    return image_dataset("digits", split, DIGITS_SPLITS, X[train], Y[train], X[test], Y[test], 16)


# MNIST (IDX files) ---------------------------------------------------------------------

_MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def _find_file(folder: Path, stem: str, what: str) -> Path:
    for candidate in (folder / stem, folder / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{what}: no {stem} (or {stem}.gz) in {folder}")


def _read_idx(path: Path, ndim: int) -> np.ndarray:
    """Read an IDX file of unsigned bytes with ``ndim`` dimensions (gzip-compressed if ``.gz``).

    Header: two zero bytes, the type code (0x08 = unsigned byte), the number of dimensions,
    then each dimension as a big-endian 32-bit integer; then the values, row-major.
    """
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"{path}: cannot read the file: {e}") from e
    expected = 0x0800 | ndim
    if len(raw) < 4:
        raise ValueError(f"{path}: {len(raw)} bytes, too short for an IDX header")
    (magic,) = struct.unpack(">I", raw[:4])
    if magic != expected:
        raise ValueError(
            f"{path}: magic number 0x{magic:08X}, expected 0x{expected:08X} (an IDX file of "
            f"unsigned bytes with {ndim} dimension{'s' if ndim > 1 else ''})"
        )
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(
            f"{path}: {len(raw)} bytes, too short for the {ndim} dimensions of its header"
        )
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    size = int(np.prod(dims, dtype=np.int64))
    if len(raw) - header != size:
        raise ValueError(
            f"{path}: the header gives dimensions {dims} ({size} values) but the "
            f"file holds {len(raw) - header} bytes after it"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def _check_labels(labels: np.ndarray, num_classes: int, where: str) -> None:
    bad = (labels < 0) | (labels >= num_classes)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{where}: label {int(labels[i])} at position {i} is not a class 0..{num_classes - 1}"
        )


def read_mnist_idx(path: PathLike) -> UCIDataset:
    """Read MNIST from the four IDX files in folder ``path``; the official 60,000/10,000 split.

    :func:`~deepgp_gi.datasets.load_mnist` calls this for a folder of IDX files (and with no
    argument reads the arrays ``tools/fetch_mnist.py`` wrote instead). Nothing is downloaded:
    ``path`` must hold ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
    ``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte``, each possibly gzip-compressed with a
    ``.gz`` suffix (the uncompressed file is used when both exist). The IDX headers are checked
    (magic numbers 0x00000803 for images and 0x00000801 for labels, dimensions against the file
    size), images must be 28 x 28 and labels 0..9. Any file set in this layout loads, whatever its
    number of images.

    Pixels 0..255 are divided by 255 (``x_mean = 0``, ``x_std = 255``); the targets are the
    labels as float64 in one column (``y_mean = 0``, ``y_std = 1``), for
    ``gpflow.likelihoods.Softmax(10)``. Every image is held in memory as float64 (8 bytes a
    pixel: ``70000 * 784 * 8`` bytes for the full set).

    :param path: folder holding the four files.
    :returns: A :class:`UCIDataset` named ``"mnist"``, split 0 of 1, with
        X_train [N_train, 28, 28, 1], Y_train [N_train, 1], X_test [N_test, 28, 28, 1],
        Y_test [N_test, 1], all float64.
    :raises FileNotFoundError: ``path`` is not a folder or a file is missing (the message
        names it).
    :raises ValueError: a bad magic number, a header that disagrees with the file size, images
        that are not 28 x 28, different numbers of images and labels, labels outside 0..9.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"load_mnist: path {str(path)!r} is not a folder")
    arrays = {}
    for key, stem in _MNIST_FILES.items():
        file = _find_file(folder, stem, "load_mnist")
        arrays[key] = _read_idx(file, 3 if key.endswith("images") else 1)
        if key.endswith("images") and arrays[key].shape[1:] != (28, 28):
            raise ValueError(
                f"{file}: images of {arrays[key].shape[1]} x {arrays[key].shape[2]} "
                f"pixels, expected 28 x 28"
            )
    for part in ("train", "test"):
        images, labels = arrays[f"{part}_images"], arrays[f"{part}_labels"]
        if len(images) != len(labels):
            raise ValueError(
                f"load_mnist: {_MNIST_FILES[f'{part}_images']} holds {len(images)} "
                f"images but {_MNIST_FILES[f'{part}_labels']} holds {len(labels)} labels"
            )
        _check_labels(labels, 10, f"load_mnist: {_MNIST_FILES[f'{part}_labels']}")
    return image_dataset(
        "mnist",
        0,
        1,
        arrays["train_images"][..., None],
        arrays["train_labels"],
        arrays["test_images"][..., None],
        arrays["test_labels"],
        255,
    )


# CIFAR-10 (python pickles) -------------------------------------------------------------

_CIFAR_DIR = "cifar-10-batches-py"
_CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
_CIFAR_TEST = "test_batch"


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles plain containers and NumPy arrays only; any other class or function in the
    file is refused rather than imported and called (a pickle can run arbitrary code)."""

    _ALLOWED = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        # The functions NumPy's pickles reconstruct arrays with (numpy 1 and 2 module names).
        **{
            (m, "_reconstruct"): np.ndarray.__reduce__(np.zeros(1))[0]
            for m in ("numpy.core.multiarray", "numpy._core.multiarray")
        },
        **{
            (m, "_frombuffer"): np.zeros(1).__reduce_ex__(5)[0]
            for m in ("numpy.core.numeric", "numpy._core.numeric")
        },
        # How Python 3 writes bytes objects in protocol 0-2 pickles.
        ("_codecs", "encode"): codecs.encode,
    }

    def find_class(self, module, name):
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refusing to load {module}.{name}: a CIFAR-10 batch holds only dicts, lists, "
                f"bytes, numbers and NumPy arrays"
            ) from None


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with open(path, "rb") as f:
            batch = _ArrayUnpickler(f, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: not a CIFAR-10 python batch: {e}") from e
    if not isinstance(batch, dict):
        raise ValueError(f"{path}: a CIFAR-10 batch is a pickled dict, got {type(batch).__name__}")

    def get(key: str):
        for k in (key.encode(), key):
            if k in batch:
                return batch[k]
        raise ValueError(
            f"{path}: the batch has no {key.encode()!r} entry (keys: {sorted(map(repr, batch))})"
        )

    data, labels = np.asarray(get("data")), np.asarray(get("labels"))
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or data.dtype != np.uint8:
        raise ValueError(
            f"{path}: b'data' must be a uint8 array [n, 3072] (3 x 32 x 32 pixels, "
            f"channel-major), got {data.dtype} {list(data.shape)}"
        )
    if (
        labels.ndim != 1
        or labels.shape[0] != data.shape[0]
        or not np.issubdtype(labels.dtype, np.integer)
    ):
        raise ValueError(
            f"{path}: b'labels' must be {data.shape[0]} integer labels, one per image, "
            f"got {labels.dtype} {list(labels.shape)}"
        )
    _check_labels(labels, 10, str(path))
    # Channel-major rows [n, 3 * 32 * 32] -> images [n, 32 (rows), 32 (columns), 3 (RGB)].
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels


def load_cifar10(path: PathLike) -> UCIDataset:
    """Read CIFAR-10 from its python version; the official 50,000/10,000 split.

    Nothing is downloaded: ``path`` is the ``cifar-10-batches-py`` folder of the python
    version of CIFAR-10 (``data_batch_1`` ... ``data_batch_5`` for training, ``test_batch`` for
    testing), or a folder that contains it. Each batch is a pickled dict whose ``b"data"`` is a
    uint8 array [n, 3072] of channel-major rows (1024 red, then green, then blue values, each
    a 32 x 32 image in row-major order) and whose ``b"labels"`` holds n labels 0..9. The
    pickles are read with an unpickler that only builds containers and NumPy arrays.

    Pixels 0..255 are divided by 255 (``x_mean = 0``, ``x_std = 255``) and laid out
    height x width x channel; the targets are the labels as float64 in one column
    (``y_mean = 0``, ``y_std = 1``), for ``gpflow.likelihoods.Softmax(10)``. Every image is
    held in memory as float64 (8 bytes a value: ``60000 * 3072 * 8`` bytes for the full set).

    :param path: the ``cifar-10-batches-py`` folder or its parent.
    :returns: A :class:`UCIDataset` named ``"cifar10"``, split 0 of 1, with
        X_train [N_train, 32, 32, 3], Y_train [N_train, 1], X_test [N_test, 32, 32, 3],
        Y_test [N_test, 1], all float64.
    :raises FileNotFoundError: ``path`` is not a folder or a batch file is missing (the message
        names it).
    :raises ValueError: a file that is not a CIFAR-10 batch: not a dict, no ``b"data"`` or
        ``b"labels"``, data not uint8 [n, 3072], a label count that differs from the image
        count, labels outside 0..9.
    """
    given = Path(path)
    if not given.is_dir():
        raise FileNotFoundError(f"load_cifar10: path {str(path)!r} is not a folder")
    folder = given / _CIFAR_DIR if (given / _CIFAR_DIR).is_dir() else given
    for name in (*_CIFAR_TRAIN, _CIFAR_TEST):
        if not (folder / name).is_file():
            where = (
                f"{folder}"
                if folder != given
                else f"{given} (nor in a {_CIFAR_DIR} folder inside it)"
            )
            raise FileNotFoundError(
                f"load_cifar10: no {name} in {where}; path must be the "
                f"{_CIFAR_DIR} folder of CIFAR-10's python version or its parent"
            )
    train = [_read_cifar_batch(folder / name) for name in _CIFAR_TRAIN]
    X_test, Y_test = _read_cifar_batch(folder / _CIFAR_TEST)
    n_train = sum(len(x) for x, _ in train)
    X_train = np.empty((n_train, 32, 32, 3), dtype=np.float64)
    np.concatenate([x for x, _ in train], axis=0, out=X_train)
    Y_train = np.concatenate([y for _, y in train])
    return image_dataset("cifar10", 0, 1, X_train, Y_train, X_test, Y_test, 255)
