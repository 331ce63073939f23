"""Tests for the image data in deepgp_gi.datasets: the bundled 8x8 digits and the MNIST and
CIFAR-10 readers (fed tiny files written here in the exact formats)."""

import fnmatch
import gzip
import hashlib
import pickle
import struct
import tomllib
from pathlib import Path

import numpy as np
import pytest

import deepgp_gi.datasets
from deepgp_gi.datasets import (
    DIGITS_SPLITS,
    UCIDataset,
    digits_split,
    load_cifar10,
    load_digits,
    load_digits_raw,
    load_mnist,
)

REPO = Path(__file__).resolve().parent.parent
DIGITS_DIR = (
    Path(deepgp_gi.__file__).parent / "data" / "digits"
)  # package data, beside the datasets package


def raw_csv() -> np.ndarray:
    """The bundled CSV read directly: [1797, 65] integers (64 pixels, then the label)."""
    with gzip.open(DIGITS_DIR / "digits.csv.gz", "rt") as f:
        rows = [[int(v) for v in line.split(",")] for line in f.read().splitlines()]
    return np.array(rows, dtype=np.int64)


def sorted_rows(A: np.ndarray) -> np.ndarray:
    return A[np.lexsort(A.T[::-1])]


# --------------------------------------------------------------------------------------
# Digits
# --------------------------------------------------------------------------------------


def test_bundled_digits_files_are_the_recorded_ones():
    """The committed data are byte for byte the files whose SHA-256 the licence note records
    (those of scikit-learn's wheel RECORD, checked by tools/fetch_digits.py)."""
    note = (DIGITS_DIR / "LICENSE.md").read_text()
    for name in ("digits.csv.gz", "digits.rst"):
        digest = hashlib.sha256((DIGITS_DIR / name).read_bytes()).hexdigest()
        assert f"`{name}`" in note and digest in note
    assert "BSD 3-Clause License" in note and "CC BY 4.0" in note and "scikit-learn 1." in note


def test_digits_files_are_package_data():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["deepgp_gi"]
    for file in DIGITS_DIR.iterdir():
        rel = file.relative_to(DIGITS_DIR.parent.parent).as_posix()
        assert any(fnmatch.fnmatch(rel, p) for p in patterns), rel


def test_raw_digits():
    X, Y = load_digits_raw()
    raw = raw_csv()
    assert raw.shape == (1797, 65)
    assert X.shape == (1797, 8, 8, 1) and Y.shape == (1797, 1)
    assert X.dtype == Y.dtype == np.float64
    np.testing.assert_array_equal(X.reshape(1797, 64), raw[:, :64])
    np.testing.assert_array_equal(Y[:, 0], raw[:, 64])
    assert X.min() == 0 and X.max() == 16
    # Row-major 8x8 images: pixel (r, c) is column 8 r + c of the file.
    np.testing.assert_array_equal(X[5, 2, 7, 0], raw[5, 2 * 8 + 7])
    counts = np.bincount(Y[:, 0].astype(int), minlength=10)
    assert counts.sum() == 1797 and len(counts) == 10
    assert counts.min() == 174 and counts.max() == 183
    # The class distribution of the UCI test set (optdigits.tes).
    np.testing.assert_array_equal(counts, [178, 182, 177, 183, 181, 182, 181, 179, 174, 180])


def test_load_digits_split0():
    ds = load_digits()
    assert isinstance(ds, UCIDataset)
    assert ds.name == "digits" and ds.split == 0 and ds.n_splits == DIGITS_SPLITS == 20
    assert ds.X_train.shape == (1500, 8, 8, 1) and ds.Y_train.shape == (1500, 1)
    assert ds.X_test.shape == (297, 8, 8, 1) and ds.Y_test.shape == (297, 1)
    assert ds.input_shape == (8, 8, 1) and ds.input_dim == 64
    for a in (ds.X_train, ds.Y_train, ds.X_test, ds.Y_test, ds.x_mean, ds.x_std):
        assert a.dtype == np.float64
    assert ds.x_mean == 0.0 and ds.x_std == 16.0 and ds.y_mean == 0.0 and ds.y_std == 1.0
    for X in (ds.X_train, ds.X_test):
        assert X.min() == 0.0 and X.max() == 1.0
    for Y in (ds.Y_train, ds.Y_test):
        assert set(np.unique(Y)) == set(range(10))
    np.testing.assert_array_equal(ds.unnormalise_y(ds.Y_test), ds.Y_test)


def test_digits_splits_partition_the_file_exactly():
    """Train + test of a split are all 1,797 rows of the CSV, each exactly once."""
    raw = raw_csv()
    for split in (0, 7, DIGITS_SPLITS - 1):
        ds = load_digits(split)
        rows = np.concatenate(
            [
                np.concatenate([ds.X_train.reshape(-1, 64) * 16, ds.Y_train], axis=1),
                np.concatenate([ds.X_test.reshape(-1, 64) * 16, ds.Y_test], axis=1),
            ]
        )
        np.testing.assert_array_equal(rows, np.round(rows))
        np.testing.assert_array_equal(sorted_rows(rows.astype(np.int64)), sorted_rows(raw))
        train, test = digits_split(split)
        assert len(train) == 1500 and len(test) == 297
        assert np.intersect1d(train, test).size == 0
        np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(1797))
        np.testing.assert_array_equal(ds.X_test.reshape(-1, 64) * 16, raw[test, :64])
        np.testing.assert_array_equal(ds.Y_train[:, 0], raw[train, 64])


def test_digits_splits_are_stratified():
    _, Y = load_digits_raw()
    counts = np.bincount(Y[:, 0].astype(int))
    for split in range(DIGITS_SPLITS):
        _, test = digits_split(split)
        per_class = np.bincount(Y[test, 0].astype(int), minlength=10)
        assert per_class.sum() == 297 and np.all(np.abs(per_class - 297 * counts / 1797) < 1)


def test_digits_splits_are_deterministic_and_differ():
    a, b = load_digits(3), load_digits(3)
    for attr in ("X_train", "Y_train", "X_test", "Y_test"):
        np.testing.assert_array_equal(getattr(a, attr), getattr(b, attr))
    tests = [digits_split(k)[1] for k in range(DIGITS_SPLITS)]
    for i in range(DIGITS_SPLITS):
        for j in range(i + 1, DIGITS_SPLITS):
            assert not np.array_equal(tests[i], tests[j])
    assert not np.array_equal(load_digits(0).X_test, load_digits(1).X_test)


def test_digits_split0_is_pinned():
    """Split 0 must not drift (e.g. with a NumPy release that changes the generator)."""
    _, test = digits_split(0)
    assert hashlib.sha256(test.astype("<i8").tobytes()).hexdigest()[:16] == DIGITS_SPLIT0_SHA
    np.testing.assert_array_equal(test[:10], [5, 12, 14, 16, 17, 19, 23, 24, 34, 38])


DIGITS_SPLIT0_SHA = "0ae7134f1493c94e"


@pytest.mark.parametrize("split", [20, -1, 100])
def test_digits_split_out_of_range(split):
    with pytest.raises(ValueError, match=rf"split={split} is out of range: digits has 20 splits"):
        load_digits(split)
    with pytest.raises(ValueError, match=rf"split={split}"):
        digits_split(split)


@pytest.mark.parametrize("split", [1.0, "0", None, True])
def test_digits_split_not_integer(split):
    with pytest.raises(TypeError, match="split must be an integer"):
        load_digits(split)


def test_digits_split_accepts_numpy_integers():
    np.testing.assert_array_equal(load_digits(np.int64(2)).X_test, load_digits(2).X_test)


# --------------------------------------------------------------------------------------
# MNIST
# --------------------------------------------------------------------------------------

MNIST_NAMES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def idx_bytes(array: np.ndarray, magic: int | None = None) -> bytes:
    """An IDX file of unsigned bytes: magic (0x0800 + ndim), big-endian dims, values."""
    array = np.asarray(array, dtype=np.uint8)
    magic = 0x0800 | array.ndim if magic is None else magic
    return struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


def mnist_arrays(seed=0, n_train=5, n_test=3, size=(28, 28)):
    rng = np.random.default_rng(seed)
    return {
        "train_images": rng.integers(0, 256, (n_train, *size), dtype=np.uint8),
        "train_labels": rng.integers(0, 10, n_train, dtype=np.uint8),
        "test_images": rng.integers(0, 256, (n_test, *size), dtype=np.uint8),
        "test_labels": rng.integers(0, 10, n_test, dtype=np.uint8),
    }


def write_mnist(folder: Path, arrays: dict, gz=(), overrides: dict | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for key, name in MNIST_NAMES.items():
        data = (overrides or {}).get(key) or idx_bytes(arrays[key])
        if key in gz:
            (folder / f"{name}.gz").write_bytes(gzip.compress(data))
        else:
            (folder / name).write_bytes(data)


@pytest.mark.parametrize(
    "gz", [(), tuple(MNIST_NAMES), ("train_images", "test_labels")], ids=["plain", "gzip", "mixed"]
)
def test_load_mnist(tmp_path, gz):
    arrays = mnist_arrays()
    arrays["train_images"][0, 0, :3] = [0, 255, 17]  # the extremes and a known value
    write_mnist(tmp_path, arrays, gz=gz)
    ds = load_mnist(tmp_path)
    assert isinstance(ds, UCIDataset) and ds.name == "mnist" and ds.split == 0 and ds.n_splits == 1
    assert ds.X_train.shape == (5, 28, 28, 1) and ds.Y_train.shape == (5, 1)
    assert ds.X_test.shape == (3, 28, 28, 1) and ds.Y_test.shape == (3, 1)
    for a in (ds.X_train, ds.Y_train, ds.X_test, ds.Y_test):
        assert a.dtype == np.float64
    assert ds.x_mean == 0.0 and ds.x_std == 255.0 and ds.y_mean == 0.0 and ds.y_std == 1.0
    np.testing.assert_array_equal(ds.X_train[0, 0, :3, 0], [0.0, 1.0, 17 / 255])
    np.testing.assert_array_equal(ds.X_train[..., 0] * 255, arrays["train_images"])
    np.testing.assert_array_equal(ds.X_test[..., 0] * 255, arrays["test_images"])
    np.testing.assert_array_equal(ds.Y_train[:, 0], arrays["train_labels"])
    np.testing.assert_array_equal(ds.Y_test[:, 0], arrays["test_labels"])
    assert ds.X_train.min() >= 0 and ds.X_train.max() <= 1


def test_load_mnist_prefers_uncompressed(tmp_path):
    arrays, other = mnist_arrays(0), mnist_arrays(1)
    write_mnist(tmp_path, arrays)
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(
        gzip.compress(idx_bytes(other["test_images"]))
    )
    np.testing.assert_array_equal(load_mnist(tmp_path).X_test[..., 0] * 255, arrays["test_images"])


@pytest.mark.parametrize("missing", list(MNIST_NAMES))
def test_load_mnist_missing_file(tmp_path, missing):
    write_mnist(tmp_path, mnist_arrays())
    (tmp_path / MNIST_NAMES[missing]).unlink()
    name = MNIST_NAMES[missing]
    with pytest.raises(FileNotFoundError, match=rf"no {name} \(or {name}\.gz\) in"):
        load_mnist(tmp_path)


def test_load_mnist_path_not_a_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        load_mnist(tmp_path / "nowhere")


def test_load_mnist_bad_magic(tmp_path):
    arrays = mnist_arrays()
    # A label file where the images should be, and a file with a wrong data-type code.
    write_mnist(tmp_path, arrays, overrides={"train_images": idx_bytes(arrays["train_labels"])})
    with pytest.raises(
        ValueError,
        match=r"train-images-idx3-ubyte: magic number 0x00000801, "
        r"expected 0x00000803",
    ):
        load_mnist(tmp_path)
    bad = bytearray(idx_bytes(arrays["test_labels"]))
    bad[2] = 0x0D  # float
    write_mnist(tmp_path, arrays, gz=("test_labels",), overrides={"test_labels": bytes(bad)})
    (tmp_path / MNIST_NAMES["test_labels"]).unlink()
    with pytest.raises(ValueError, match=r"t10k-labels-idx1-ubyte\.gz: magic number 0x00000D01"):
        load_mnist(tmp_path)


def test_load_mnist_truncated_and_wrong_shapes(tmp_path):
    arrays = mnist_arrays()
    write_mnist(tmp_path, arrays, overrides={"test_images": idx_bytes(arrays["test_images"])[:-1]})
    with pytest.raises(ValueError, match=r"dimensions \(3, 28, 28\).*2351 bytes"):
        load_mnist(tmp_path)
    write_mnist(tmp_path, arrays, overrides={"test_images": b"\x00\x00"})
    with pytest.raises(ValueError, match="too short for an IDX header"):
        load_mnist(tmp_path)
    write_mnist(tmp_path, mnist_arrays(size=(32, 28)))
    with pytest.raises(ValueError, match="images of 32 x 28 pixels, expected 28 x 28"):
        load_mnist(tmp_path)


def test_load_mnist_count_mismatch_and_bad_labels(tmp_path):
    arrays = mnist_arrays()
    write_mnist(tmp_path, arrays, overrides={"train_labels": idx_bytes(arrays["train_labels"][:4])})
    with pytest.raises(
        ValueError,
        match="train-images-idx3-ubyte holds 5 images but train-labels-idx1-ubyte holds 4 labels",
    ):
        load_mnist(tmp_path)
    labels = arrays["test_labels"].copy()
    labels[1] = 10
    write_mnist(tmp_path, arrays, overrides={"test_labels": idx_bytes(labels)})
    with pytest.raises(ValueError, match="label 10 at position 1 is not a class 0..9"):
        load_mnist(tmp_path)


def test_load_mnist_bad_gzip(tmp_path):
    write_mnist(tmp_path, mnist_arrays())
    (tmp_path / MNIST_NAMES["train_labels"]).unlink()
    (tmp_path / (MNIST_NAMES["train_labels"] + ".gz")).write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="train-labels-idx1-ubyte.gz: cannot read the file"):
        load_mnist(tmp_path)


# --------------------------------------------------------------------------------------
# CIFAR-10
# --------------------------------------------------------------------------------------

CIFAR_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


class Py2Pickler(pickle._Pickler):
    """Pickles like Python 2's cPickle, which wrote the CIFAR-10 python batches: str and bytes
    as byte strings (BINSTRING), read back as bytes with ``encoding="bytes"``."""

    def save_bytes(self, obj):
        n = len(obj)
        self.write(
            (
                pickle.SHORT_BINSTRING + bytes([n])
                if n < 256
                else pickle.BINSTRING + struct.pack("<i", n)
            )
            + obj
        )
        self.memoize(obj)

    def save_str(self, obj):
        self.save_bytes(obj.encode("latin1"))

    dispatch = dict(pickle._Pickler.dispatch)
    dispatch[bytes] = save_bytes
    dispatch[str] = save_str


def cifar_batches(seed=0, sizes=(1, 1, 1, 1, 1, 3)):
    """Per file: images [n, 32, 32, 3] uint8 (distinct across rows, columns and channels, so any
    wrong transpose changes them) and labels [n]."""
    rng = np.random.default_rng(seed)
    out = []
    for n in sizes:
        images = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
        out.append((images, rng.integers(0, 10, n).tolist()))
    return out


def write_cifar(folder: Path, batches, edit=None, protocol="py2") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, (images, labels) in zip(CIFAR_FILES, batches):
        # The python version's layout: rows of 1024 red, 1024 green, 1024 blue values.
        data = images.transpose(0, 3, 1, 2).reshape(len(images), 3072)
        batch = {
            b"batch_label": name.encode(),
            b"labels": labels,
            b"data": data,
            b"filenames": [f"img{i}.png".encode() for i in range(len(images))],
        }
        if edit is not None:
            batch = edit(name, batch)
        with open(folder / name, "wb") as f:
            if protocol == "py2":
                Py2Pickler(f, protocol=2).dump(batch)
            else:
                pickle.dump(batch, f, protocol=protocol)


@pytest.mark.parametrize("parent", [False, True])
def test_load_cifar10(tmp_path, parent):
    batches = cifar_batches()
    write_cifar(tmp_path / "cifar-10-batches-py", batches)
    ds = load_cifar10(tmp_path if parent else tmp_path / "cifar-10-batches-py")
    assert (
        isinstance(ds, UCIDataset) and ds.name == "cifar10" and ds.split == 0 and ds.n_splits == 1
    )
    assert ds.X_train.shape == (5, 32, 32, 3) and ds.Y_train.shape == (5, 1)
    assert ds.X_test.shape == (3, 32, 32, 3) and ds.Y_test.shape == (3, 1)
    for a in (ds.X_train, ds.Y_train, ds.X_test, ds.Y_test):
        assert a.dtype == np.float64
    assert ds.x_mean == 0.0 and ds.x_std == 255.0 and ds.y_mean == 0.0 and ds.y_std == 1.0
    train_images = np.concatenate([b[0] for b in batches[:5]])
    np.testing.assert_array_equal(ds.X_train * 255, train_images)
    np.testing.assert_array_equal(ds.X_test * 255, batches[5][0])
    np.testing.assert_array_equal(ds.Y_train[:, 0], sum((b[1] for b in batches[:5]), []))
    np.testing.assert_array_equal(ds.Y_test[:, 0], batches[5][1])
    assert ds.X_train.min() >= 0 and ds.X_train.max() <= 1


def test_load_cifar10_channel_major_layout(tmp_path):
    """Stated directly from the file format: value k of a row is channel k // 1024, image row
    (k % 1024) // 32, column k % 32."""
    images = [(np.zeros((1, 32, 32, 3), np.uint8), [0]) for _ in CIFAR_FILES]

    def edit(name, batch):
        if name == "test_batch":
            batch[b"data"] = (np.arange(3072) % 251).astype(np.uint8)[None]
        return batch

    write_cifar(tmp_path, images, edit=edit)
    X = load_cifar10(tmp_path).X_test[0] * 255
    for k in (0, 1, 31, 32, 33, 1023, 1024, 1025 + 32 * 5 + 7, 2048, 3071):
        c, r, col = k // 1024, (k % 1024) // 32, k % 32
        assert X[r, col, c] == k % 251, k


@pytest.mark.parametrize("protocol", [2, 5])
def test_load_cifar10_accepts_python3_pickles_str_keys_and_array_labels(tmp_path, protocol):
    batches = cifar_batches()
    write_cifar(
        tmp_path,
        batches,
        protocol=protocol,
        edit=lambda name, b: {"data": b[b"data"], "labels": np.array(b[b"labels"])},
    )
    np.testing.assert_array_equal(load_cifar10(tmp_path).X_test * 255, batches[5][0])
    np.testing.assert_array_equal(load_cifar10(tmp_path).Y_test[:, 0], batches[5][1])


def test_load_cifar10_accepts_numpy2_module_names(tmp_path):
    """Batches pickled under NumPy 2 name numpy._core.multiarray; they load under NumPy 1 too."""
    batches = cifar_batches()
    write_cifar(tmp_path, batches)
    raw = (tmp_path / "test_batch").read_bytes()
    assert b"numpy.core.multiarray" in raw
    (tmp_path / "test_batch").write_bytes(
        raw.replace(b"numpy.core.multiarray", b"numpy._core.multiarray")
    )
    np.testing.assert_array_equal(load_cifar10(tmp_path).X_test * 255, batches[5][0])


@pytest.mark.parametrize("missing", ["data_batch_3", "test_batch"])
def test_load_cifar10_missing_file(tmp_path, missing):
    write_cifar(tmp_path / "cifar-10-batches-py", cifar_batches())
    (tmp_path / "cifar-10-batches-py" / missing).unlink()
    with pytest.raises(FileNotFoundError, match=rf"no {missing} in .*cifar-10-batches-py"):
        load_cifar10(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        FileNotFoundError, match=r"no data_batch_1 in .*empty \(nor in a cifar-10-batches-py"
    ):
        load_cifar10(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        load_cifar10(tmp_path / "nowhere")


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda b: [b], "a CIFAR-10 batch is a pickled dict, got list"),
        (lambda b: {b"labels": b[b"labels"]}, r"no b'data' entry"),
        (lambda b: {**b, b"data": b[b"data"][:, :3000]}, r"uint8 array \[n, 3072\].*\[3, 3000\]"),
        (
            lambda b: {**b, b"data": b[b"data"].astype(np.float32)},
            r"uint8 array \[n, 3072\].*float32",
        ),
        (lambda b: {**b, b"labels": b[b"labels"][:2]}, r"must be 3 integer labels"),
        (lambda b: {**b, b"labels": [1, 2, 10]}, r"label 10 at position 2 is not a class 0..9"),
    ],
)
def test_load_cifar10_bad_batches(tmp_path, edit, match):
    write_cifar(
        tmp_path, cifar_batches(), edit=lambda name, b: edit(b) if name == "test_batch" else b
    )
    with pytest.raises(ValueError, match=match):
        load_cifar10(tmp_path)


class Evil:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_load_cifar10_refuses_arbitrary_pickles(tmp_path, capsys):
    write_cifar(
        tmp_path,
        cifar_batches(),
        edit=lambda name, b: {**b, b"x": Evil()} if name == "data_batch_2" else b,
    )
    with pytest.raises(
        ValueError,
        match=r"data_batch_2: not a CIFAR-10 python batch: "
        r"refusing to load (__builtin__|builtins)\.print",
    ):
        load_cifar10(tmp_path)
    assert "must never run" not in capsys.readouterr().out
    (tmp_path / "data_batch_2").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="data_batch_2: not a CIFAR-10 python batch"):
        load_cifar10(tmp_path)


def test_standardise_images_uses_training_statistics():
    from deepgp_gi.datasets import standardise_images

    rng = np.random.default_rng(0)
    Xtr, Xte = 3.0 + 2.0 * rng.random((20, 4, 4, 1)), rng.random((5, 4, 4, 1))
    Str, Ste = standardise_images(Xtr, Xte)
    assert abs(Str.mean()) < 1e-12 and abs(Str.std() - 1.0) < 1e-12
    np.testing.assert_allclose(Ste, (Xte - Xtr.mean()) / Xtr.std(), rtol=1e-12)
    with pytest.raises(ValueError, match="X_train"):
        standardise_images(np.ones((3, 2, 2, 1)), Xte)
