"""Saving and loading models (deepgp_gi.saving, deepgp_gi.export).

Oracles: a loaded model's predict_f, predict_y, predict_log_density (and predict_proba) equal the
in-memory model's with the same num_samples and seed to 1e-10; the serving signature, called in a
process that imports TensorFlow only, equals predict_y with the record's sample count and seed.
The default suite covers one model of each kind; the sweep over every family is marked slow.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gpflow
import numpy as np
import pytest

import deepgp_gi as dg
from deepgp_gi import saving
from deepgp_gi.transforms import Standardisation

TOL = 1e-10


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((30, 2))
    Y = np.sin(2.0 * X[:, :1]) + 0.1 * rng.standard_normal((30, 1))
    images = rng.standard_normal((12, 4, 4, 1))
    labels = (np.arange(12) % 3)[:, None].astype(float)
    return X, Y, images, labels


@pytest.fixture(scope="module")
def saved(data, tmp_path_factory):
    """A mean-field deep GP and the directory it is saved in (9 serving samples, seed 3)."""
    model, _, _ = build("deep_gp", "mean_field", data)
    return model, Path(
        dg.save(
            model, tmp_path_factory.mktemp("saved") / "model", serving_samples=9, serving_seed=3
        )
    )


def build(kind, family, data, train_sampler=True):
    """A tiny model of ``kind`` (``deep_gp``, ``latent``, ``bnn``, ``conv``, ``classifier``) and the
    ``(X, Y)`` it predicts on; sampling families are fitted briefly and their samples collected
    (or, without ``train_sampler``, given four perturbed copies of the chain's state as samples)."""
    X, Y, images, labels = data
    if kind == "conv":
        model = dg.build_conv_bnn(
            images,
            labels,
            posterior=family,
            num_inducing=4,
            channels=(2, 2),
            hidden=(4,),
            kernel_size=3,
            seed=0,
        )
        return model, images, labels
    if kind == "classifier":
        classes = (X[:, :1] > 0).astype(float) + (X[:, 1:] > 1).astype(float)
        model = dg.build_deep_gp(
            X,
            classes,
            depth=2,
            posterior=family,
            num_inducing=5,
            seed=0,
            likelihood=gpflow.likelihoods.MultiClass(3),
        )
        return model, X, classes
    if kind == "bnn":
        model = dg.build_bnn(X, Y, hidden=(4,), posterior=family, num_inducing=5, seed=0)
    else:
        model = dg.build_deep_gp(
            X,
            Y,
            depth=2,
            posterior=family,
            num_inducing=5,
            seed=0,
            latent_dim=1 if kind == "latent" else None,
        )
    if getattr(model.posterior, "is_sampler", False) and train_sampler:
        dg.fit(model, (X, Y), steps=3, seed=0, progress=False)
        dg.collect_samples(model, (X, Y), num_samples=4, thin=2, seed=0, progress=False)
    elif getattr(model.posterior, "is_sampler", False):
        rng = np.random.default_rng(1)
        model.posterior.store_samples(
            [
                v.numpy() + 0.3 * rng.standard_normal((4,) + tuple(v.shape))
                for v in model.posterior.chain_variables()
            ]
        )
    return model, X, Y


def assert_loaded_equals_model(model, loaded, X, Y):
    for num_samples, seed in ((3, 5), (7, [11, 2])):
        for name in ("predict_f", "predict_y"):
            want = getattr(model, name)(X, num_samples, seed=seed)
            got = getattr(loaded, name)(X, num_samples, seed=seed)
            for w, g in zip(want, got):
                np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=0, atol=TOL, err_msg=name)
        want = model.predict_log_density((X, Y), num_samples, seed=seed)
        got = loaded.predict_log_density((X, Y), num_samples, seed=seed)
        np.testing.assert_allclose(
            got.numpy(), want.numpy(), rtol=0, atol=TOL, err_msg="predict_log_density"
        )


def round_trip(kind, family, data, tmp_path, train_sampler=True):
    model, X, Y = build(kind, family, data, train_sampler)
    path = dg.save(model, tmp_path / "model")
    loaded = dg.load(path)
    assert_loaded_equals_model(model, loaded, X, Y)
    return model, loaded, X, Y


# a deep GP and a BNN in the default suite, the other kinds beside them in the slow suite (their
# first traces take most of a minute each), and every family in the slow sweep below
@pytest.mark.parametrize(
    "kind, family",
    [
        ("deep_gp", "mean_field"),
        pytest.param("deep_gp", "sghmc", marks=pytest.mark.slow),
        pytest.param("latent", "global", marks=pytest.mark.slow),
        ("bnn", "factorised"),
        pytest.param("conv", "factorised", marks=pytest.mark.slow),
    ],
)
def test_a_loaded_model_predicts_as_the_model(kind, family, data, tmp_path):
    model, loaded, X, Y = round_trip(kind, family, data, tmp_path, train_sampler=False)
    record = loaded.record
    assert record["family"] == family and loaded.family == family
    assert record["kind"] == {"latent": "latent_deep_gp", "conv": "conv_bnn"}.get(kind, kind)
    assert record["depth"] == model.depth and len(record["widths"]) == model.depth
    mean, var, log_weights = (t.numpy() for t in loaded.predict_y_components(X, 4, seed=2))
    w = np.exp(log_weights)[:, None, None]
    mixture_mean = np.sum(w * mean, axis=0)
    y_mean, y_var = loaded.predict_y(X, 4, seed=2)
    np.testing.assert_allclose(mixture_mean, y_mean.numpy(), rtol=0, atol=TOL)
    np.testing.assert_allclose(
        np.sum(w * (var + mean**2), axis=0) - mixture_mean**2, y_var.numpy(), rtol=0, atol=1e-9
    )
    if kind == "bnn":  # sampled weights: no seed, fresh draws
        first, second = (loaded.predict_y_components(X, 2)[0].numpy() for _ in range(2))
        assert first.shape == (2, len(X), 1) and not np.array_equal(first, second)
    if family == "sghmc":  # the saved model keeps the collected samples
        stored = [s.numpy() for s in model.posterior.samples]
        assert stored[0].shape[0] == 4
        # the model now predicts from its window, the saved one from its samples
        model.posterior.clear_samples()
        assert not np.allclose(
            model.predict_y(X, 5, seed=1)[0].numpy(), loaded.predict_y(X, 5, seed=1)[0].numpy()
        )
        model.posterior.store_samples(stored)
        assert_loaded_equals_model(model, loaded, X, Y)


def _sweep():
    families = dg.families
    from deepgp_gi.latent import LATENT_FAMILIES

    cases = [("deep_gp", f) for f in families.DEEP_GP_FAMILIES] + [
        ("latent", f) for f in LATENT_FAMILIES
    ]
    cases += [("bnn", f) for f in families.BNN_FAMILIES] + [
        ("conv", f) for f in families.CONV_BNN_FAMILIES
    ]
    return cases + [("classifier", "global")]


@pytest.mark.slow  # every family of every model kind (several minutes)
@pytest.mark.parametrize("kind, family", _sweep())
def test_every_family_round_trips(kind, family, data, tmp_path):
    _, loaded, _, _ = round_trip(kind, family, data, tmp_path)
    assert loaded.family == family


@pytest.mark.slow  # a classifier's save and load (also tests/test_table_cli.py, slow too)
def test_a_classifier_gives_class_probabilities(data, saved, tmp_path):
    model, X, labels = build("classifier", "mean_field", data)
    loaded = dg.load(dg.save(model, tmp_path / "m", class_names=["low", "mid", "high"]))
    assert loaded.is_classifier and loaded.class_names == ["low", "mid", "high"]
    probs = loaded.predict_proba(X, 5, seed=1).numpy()
    want = model.predict_y(X, 5, seed=1)[0].numpy()
    np.testing.assert_allclose(probs, want / want.sum(axis=1, keepdims=True), rtol=0, atol=TOL)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(
        loaded.serve(X)["probabilities"].numpy(),
        loaded.predict_proba(X, loaded.serving_samples, seed=0).numpy(),
        rtol=0,
        atol=TOL,
    )
    assert_loaded_equals_model(model, loaded, X, labels)
    regressor = dg.load(saved[1])
    with pytest.raises(TypeError, match="predict_proba needs a classifier"):
        regressor.predict_proba(X)


@pytest.mark.slow  # two saves with and without a transform
def test_a_transform_puts_predictions_in_the_data_units(data, tmp_path):
    X, Y, _, _ = data
    X_data, Y_data = 3.0 + 5.0 * X, -2.0 + 10.0 * Y
    transform = Standardisation.fit(X_data, Y_data)
    model = dg.build_deep_gp(
        transform.inputs(X_data),
        transform.targets(Y_data),
        depth=2,
        posterior="mean_field",
        num_inducing=5,
        seed=0,
    )
    loaded = dg.load(
        dg.save(
            model,
            tmp_path / "m",
            transform=transform,
            input_names=["a", "b"],
            output_names=["target"],
        )
    )
    assert loaded.input_names == ["a", "b"] and loaded.output_names == ["target"]
    Xs = transform.inputs(X_data)
    mean, var = model.predict_y(Xs, 4, seed=2)
    got_mean, got_var = loaded.predict_y(X_data, 4, seed=2)
    scale, shift = transform.target_scale, transform.target_mean
    np.testing.assert_allclose(got_mean.numpy(), mean.numpy() * scale + shift, rtol=0, atol=TOL)
    np.testing.assert_allclose(got_var.numpy(), var.numpy() * scale**2, rtol=0, atol=TOL)
    logp = (
        model.predict_log_density((Xs, transform.targets(Y_data)), 4, seed=2).numpy()
        - np.log(scale).sum()
    )
    np.testing.assert_allclose(
        loaded.predict_log_density((X_data, Y_data), 4, seed=2).numpy(), logp, rtol=0, atol=TOL
    )
    record = json.loads((tmp_path / "m" / saving.RECORD_FILE).read_text())
    assert (
        Standardisation.from_json(record["transform"]) == transform
        and loaded.transform == transform
    )
    with pytest.raises(ValueError, match="transform has 3 input columns but the model takes 2"):
        dg.save(model, tmp_path / "bad", transform=Standardisation(np.zeros(3), np.ones(3)))
    assert not (tmp_path / "bad").exists()


SERVE = """
import json, sys
import numpy as np
import tensorflow as tf
saved = tf.saved_model.load(sys.argv[1])
out = saved.signatures["serving_default"](inputs=tf.constant(np.array(json.loads(sys.argv[2]))))
print(json.dumps({k: v.numpy().tolist() for k, v in out.items()}))
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("deepgp_gi", "gpflow"))))
"""


def test_the_record_and_the_serving_signature(saved, data, tmp_path):
    model, path = saved
    X = data[0]
    record = json.loads((path / saving.RECORD_FILE).read_text())
    import tensorflow as tf

    assert (
        record["format"] == saving.FORMAT_NAME and record["format_version"] == saving.FORMAT_VERSION
    )
    assert (
        record["deepgp_gi_version"] == dg.__version__
        and record["tensorflow_version"] == tf.__version__
    )
    assert record["family"] == "mean_field" and record["kind"] == "deep_gp" and record["depth"] == 2
    assert record["widths"] == [layer.output_dim for layer in model.layers]
    assert (
        record["input_dim"] == 2
        and record["input_names"] == ["x0", "x1"]
        and record["output_names"] == ["y0"]
    )
    assert record["serving"]["num_samples"] == 9 and record["serving"]["seed"] == [3, 0]
    assert record["transform"] is None and record["classifier"] is False
    assert set(record["signatures"]) == {"serving_default", "predict", "log_density"}
    # served in a process that imports TensorFlow only
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run(
        [sys.executable, "-c", SERVE, str(path), json.dumps(X[:5].tolist())],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    served, imported = json.loads(lines[-2]), json.loads(lines[-1])
    assert imported == []
    mean, var = model.predict_y(X[:5], 9, seed=3)
    np.testing.assert_allclose(served["mean"], mean.numpy(), rtol=0, atol=TOL)
    np.testing.assert_allclose(served["variance"], var.numpy(), rtol=0, atol=TOL)


# ------------------------------------------------------------------------------- refusals


@pytest.mark.slow  # a second full save: `make test-all`
def test_an_existing_directory_is_replaced_only_with_overwrite(saved, tmp_path):
    model, saved_path = saved
    path = tmp_path / "m"
    shutil.copytree(saved_path, path)
    with pytest.raises(FileExistsError, match=f"{path}.*already exists; pass overwrite=True"):
        dg.save(model, path)
    dg.save(model, path, overwrite=True, serving_samples=7)
    assert dg.load(path).serving_samples == 7
    assert sorted(os.listdir(tmp_path)) == ["m"]  # no staging or old copies left beside it
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds no saved model.*refusing to replace it"):
        dg.save(model, foreign, overwrite=True)
    assert (foreign / "notes.txt").read_text() == "mine"


def test_loading_a_missing_or_foreign_directory_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"no saved model at '{tmp_path / 'nothing'}'"):
        dg.load(tmp_path / "nothing")
    (tmp_path / "foreign").mkdir()
    with pytest.raises(
        ValueError,
        match=f"'{tmp_path / 'foreign'}' is not a deepgp_gi saved model: it has no deepgp_gi.json",
    ):
        dg.load(tmp_path / "foreign")
    (tmp_path / "foreign" / saving.RECORD_FILE).write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="is not a deepgp_gi saved model"):
        dg.load(tmp_path / "foreign")
    (tmp_path / "foreign" / saving.RECORD_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="cannot be read"):
        dg.load(tmp_path / "foreign")


def _copy_with_record(saved_path, tmp_path, **changes):
    path = tmp_path / "copy"
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(saved_path, path)
    record = json.loads((path / saving.RECORD_FILE).read_text())
    record.update(changes)
    (path / saving.RECORD_FILE).write_text(json.dumps(record))
    return path


def test_another_format_version_or_an_older_release_is_refused(saved, tmp_path):
    _, path = saved
    other = _copy_with_record(
        path, tmp_path, format_version=saving.FORMAT_VERSION + 1, deepgp_gi_version="9.0.0"
    )
    with pytest.raises(
        ValueError,
        match=rf"saved in format version {saving.FORMAT_VERSION + 1} by deepgp_gi 9\.0\.0; "
        rf"this release \(deepgp_gi {dg.__version__}\) reads format version "
        rf"{saving.FORMAT_VERSION} only",
    ):
        dg.load(other)
    old = _copy_with_record(path, tmp_path, deepgp_gi_version="0.0.9")
    with pytest.raises(ValueError, match=r"saved by deepgp_gi 0\.0\.9, older than 0\.1\.0"):
        dg.load(old)


@pytest.mark.slow  # a second full save
def test_an_interrupted_save_leaves_nothing_behind(saved, monkeypatch, tmp_path):
    model, saved_path = saved
    import tensorflow as tf

    real_save = tf.saved_model.save

    def fail_midway(obj, directory, **kwargs):
        real_save(obj, directory, **kwargs)  # the SavedModel is written, the record is not
        raise KeyboardInterrupt("interrupted")

    monkeypatch.setattr(tf.saved_model, "save", fail_midway)
    with pytest.raises(KeyboardInterrupt):
        dg.save(model, tmp_path / "m")
    assert os.listdir(tmp_path) == []
    monkeypatch.undo()
    shutil.copytree(saved_path, tmp_path / "m")
    X = np.linspace(-1, 1, 8)[:, None] * np.ones((1, 2))
    before = dg.load(tmp_path / "m").predict_y(X, 3, seed=0)[0].numpy()

    def export_then_fail(exported, directory):
        (Path(directory) / "saved_model.pb").write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(saving, "_export", export_then_fail)
    with pytest.raises(OSError, match="disk full"):
        dg.save(model, tmp_path / "m", overwrite=True, serving_samples=5)
    assert os.listdir(tmp_path) == ["m"]
    loaded = dg.load(tmp_path / "m")
    assert loaded.serving_samples == 9
    np.testing.assert_array_equal(loaded.predict_y(X, 3, seed=0)[0].numpy(), before)


def test_bad_arguments_name_the_argument(saved, tmp_path):
    model, path = saved
    loaded = dg.load(path)
    with pytest.raises(TypeError, match="model must be a deepgp_gi.DeepGP"):
        dg.save("model", tmp_path / "m")
    with pytest.raises(ValueError, match="input_names must hold 2"):
        dg.save(model, tmp_path / "m", input_names=["a"])
    with pytest.raises(ValueError, match="Xnew has 3 columns"):
        loaded.predict_y(np.zeros((4, 3)))
    with pytest.raises(ValueError, match="num_samples must be at least 1"):
        loaded.predict_f(np.zeros((4, 2)), num_samples=0)
    with pytest.raises(ValueError, match="seed must be an int or a pair"):
        loaded.predict_f(np.zeros((4, 2)), seed=[1, 2, 3])
    with pytest.raises(ValueError, match="Xnew has 4 rows but Ynew has 3"):
        loaded.predict_log_density((np.zeros((4, 2)), np.zeros((3, 1))))
    assert not (tmp_path / "m").exists()


@pytest.mark.slow  # trains and saves a model: the docs page's examples
def test_the_saving_page_runs():
    from doc_examples import run_page

    namespace = run_page("saving.md")
    try:
        assert namespace["record"]["family"] == "mean_field"
        assert set(namespace["response"]["predictions"][0]) == {"mean", "variance"}
    finally:
        shutil.rmtree(namespace["where"], ignore_errors=True)
