"""Keep a model on disk and load it back: :func:`save` and :func:`load`.

A saved model is a directory holding

* a TensorFlow SavedModel (``saved_model.pb``, ``variables/``) of the model's variables and its
  prediction functions (:mod:`deepgp_gi.export`), with a ``serving_default`` signature that
  TF Serving (or ``tf.saved_model.load`` in a process that never imports :mod:`deepgp_gi`) can
  call;
* a small JSON record, ``deepgp_gi.json`` (:data:`RECORD_FILE`): the model kind and posterior
  family, depth and layer widths, input and output names and dimensions, the data transform if
  any, the library, TensorFlow and format versions, and the number of samples and the seed of
  ``serving_default``.

:func:`load` returns a :class:`LoadedModel`, which predicts as the model did: ``predict_f``,
``predict_y``, ``predict_log_density`` (and ``predict_proba`` for a classifier) take the same
``num_samples`` and ``seed``, and a seed gives the draws the model made with it. A sampling
family's stored samples (:func:`~deepgp_gi.collect_samples`) are variables of the model, so
they are saved with it.

A save is atomic: the directory is written as a temporary sibling and renamed into place at the
end, so an interrupted save leaves the old model (or nothing) at ``path``, never half of one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from .export import SIGNATURES, ExportedModel, classification_kind, seed_pair
from .models import DEFAULT_PREDICT_SAMPLES, DeepGP
from .transforms import Standardisation
from .validation import as_data_array, check_positive_int

__all__ = [
    "save",
    "load",
    "read_record",
    "LoadedModel",
    "model_description",
    "family_name",
    "RECORD_FILE",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "OLDEST_READABLE_RELEASE",
]

#: The record's file name inside a saved model's directory.
RECORD_FILE = "deepgp_gi.json"
#: The record's ``format`` entry: what marks a directory as a saved model of this library.
FORMAT_NAME = "deepgp_gi saved model"
#: The layout of a saved model (the record's entries and the exported signatures). A release that
#: changes the layout changes this number; :func:`load` reads this number only.
FORMAT_VERSION = 1
#: The oldest release of the library whose saved models :func:`load` reads.
OLDEST_READABLE_RELEASE = "0.1.0"


# ============================================================================ describing a model
def model_kind(model: DeepGP) -> str:
    """``"latent_deep_gp"``, ``"conv_bnn"``, ``"bnn"`` or ``"deep_gp"``."""
    from .latent import LatentDeepGP
    from .layers.convolutional import ShapedLayer
    from .posteriors.weight_space import has_feature_map

    if isinstance(model, LatentDeepGP):
        return "latent_deep_gp"
    if any(isinstance(layer, ShapedLayer) for layer in model.layers):
        return "conv_bnn"
    if model.layers and all(has_feature_map(layer) for layer in model.layers):
        return "bnn"
    return "deep_gp"


def family_name(model: DeepGP) -> str:
    """The name of the model's posterior family in the table of its kind
    (:mod:`deepgp_gi.posteriors.registry`), or the class's name if no table lists it."""
    from .posteriors.registry import family_name as registered_name

    kind = {"conv_bnn": "conv_bnn", "bnn": "bnn"}.get(model_kind(model), "deep_gp")
    try:
        return registered_name(model.posterior, kind)
    except ValueError:
        return type(model.posterior).__name__


def _layer_width(layer) -> object:
    shape = getattr(layer, "output_shape", None)
    return [int(d) for d in shape] if shape is not None else int(layer.output_dim)


def model_description(model: DeepGP) -> dict:
    """The entries of a saved model's record that describe the model itself."""
    kind = classification_kind(model.likelihood)
    num_classes = getattr(model.likelihood, "num_classes", None)
    if kind == "bernoulli":
        num_classes = 2
    return {
        "kind": model_kind(model),
        "family": family_name(model),
        "posterior_class": type(model.posterior).__name__,
        "likelihood": type(model.likelihood).__name__,
        "classifier": kind is not None,
        "num_classes": None if num_classes is None else int(num_classes),
        "depth": int(model.depth),
        "widths": [_layer_width(layer) for layer in model.layers],
        "input_shape": [int(d) for d in model.input_shape],
        "input_dim": int(model.input_dim),
        "output_dim": int(model.output_dim),
        "target_dim": int(model.observation_columns()),
        "latent_dim": int(model.latent_dim) if hasattr(model, "latent_dim") else None,
        "num_data": None if model.num_data is None else int(model.num_data),
        "dtype": model.dtype.name,
    }


def _names(value, name: str, count: int) -> Optional[List[str]]:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a list of {count} strings, got {value!r}")
    if len(value) != count or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{name} must hold {count} non-empty strings, got {list(value)!r}")
    if len(set(value)) != len(value):
        raise ValueError(f"{name} must not repeat a name, got {list(value)!r}")
    return list(value)


def _record(
    model: DeepGP, transform, input_names, output_names, class_names, serving_samples, serving_seed
) -> dict:
    from .version import __version__

    description = model_description(model)
    flat = len(description["input_shape"]) == 1
    input_names = _names(input_names, "input_names", description["input_dim"])
    if input_names is None and flat:
        input_names = [f"x{i}" for i in range(description["input_dim"])]
    if input_names is not None and not flat:
        raise ValueError("input_names apply to flat inputs [N, D]; this model takes images")
    output_names = _names(output_names, "output_names", description["target_dim"])
    if output_names is None:
        output_names = [f"y{j}" for j in range(description["target_dim"])]
    if class_names is not None and not description["classifier"]:
        raise ValueError(
            f"class_names apply to a classifier; this model has a {description['likelihood']} "
            "likelihood"
        )
    class_names = _names(class_names, "class_names", description["num_classes"] or 0)
    if class_names is None and description["classifier"]:
        class_names = [str(c) for c in range(description["num_classes"])]
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "deepgp_gi_version": __version__,
        "tensorflow_version": tf.__version__,
        **description,
        "input_names": input_names,
        "output_names": output_names,
        "class_names": class_names,
        "transform": None if transform is None else transform.to_json(),
        "serving": {
            "signature": "serving_default",
            "inputs": "inputs",
            "outputs": ["probabilities"] if description["classifier"] else ["mean", "variance"],
            "num_samples": serving_samples,
            "seed": [int(s) for s in seed_pair(serving_seed)],
        },
        "signatures": {name: list(inputs) for name, inputs in SIGNATURES.items()},
    }


# ============================================================================ writing
def _check_target(path) -> Tuple[str, str]:
    """``(path as given, absolute path)``, checked: refuse what cannot be (re)placed."""
    try:
        given = os.fspath(path)
    except TypeError:
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}") from None
    if not isinstance(given, str) or not given:
        raise ValueError(f"path must be a non-empty directory name, got {path!r}")
    target = os.path.abspath(given)
    parent = os.path.dirname(target)
    if os.path.exists(parent) and not os.path.isdir(parent):
        raise NotADirectoryError(f"cannot save to {given!r}: {parent!r} is a file")
    return given, target


def _check_replaceable(given: str, target: str, overwrite: bool) -> None:
    if not os.path.lexists(target):
        return
    if not overwrite:
        raise FileExistsError(f"{given!r} already exists; pass overwrite=True to replace it")
    if not os.path.isdir(target) or os.path.islink(target):
        raise FileExistsError(f"{given!r} exists and is not a directory; refusing to replace it")
    if os.listdir(target) and not os.path.isfile(os.path.join(target, RECORD_FILE)):
        raise FileExistsError(
            f"{given!r} is a directory that holds no saved model (no {RECORD_FILE}); "
            "refusing to replace it"
        )


def _export(exported: ExportedModel, directory: str) -> None:
    """Write the SavedModel into ``directory``."""
    options = tf.saved_model.SaveOptions()
    tf.saved_model.save(exported, directory, signatures=exported.signatures(), options=options)


def _write_record(record: dict, directory: str) -> None:
    with open(os.path.join(directory, RECORD_FILE), "w") as fh:
        json.dump(record, fh, indent=2)
        fh.write("\n")


def _move_into_place(staging: str, target: str) -> None:
    """Rename the finished ``staging`` directory to ``target``; an old ``target`` is moved aside
    first and deleted only once the new one is in place (restored if the rename fails)."""
    old = None
    if os.path.lexists(target):
        old = tempfile.mkdtemp(
            prefix=f".{os.path.basename(target)}.", suffix=".old", dir=os.path.dirname(target)
        )
        os.rmdir(old)
        os.rename(target, old)
    try:
        os.rename(staging, target)
    except BaseException:
        if old is not None:
            os.rename(old, target)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def save(
    model: DeepGP,
    path,
    overwrite: bool = False,
    *,
    transform: Optional[Standardisation] = None,
    input_names: Optional[Sequence[str]] = None,
    output_names: Optional[Sequence[str]] = None,
    class_names: Optional[Sequence[str]] = None,
    serving_samples: int = DEFAULT_PREDICT_SAMPLES,
    serving_seed=0,
) -> str:
    """Save ``model`` to the directory ``path`` (module docs).

    :param model: a :class:`~deepgp_gi.DeepGP` or :class:`~deepgp_gi.LatentDeepGP` of any family;
        a sampling family's stored samples are saved with it.
    :param path: the directory to create.
    :param overwrite: replace a saved model already at ``path`` (a directory that holds no saved
        model, or a file, is never replaced).
    :param transform: the :class:`~deepgp_gi.transforms.Standardisation` the model's training data
        went through; the saved model then takes and returns data in the original units.
    :param input_names: names of the ``D`` input columns (default ``x0, x1, ...``).
    :param output_names: names of the target columns (default ``y0, y1, ...``).
    :param class_names: a classifier's class names, index ``c`` for label ``c`` (default
        ``"0", "1", ...``).
    :param serving_samples: the number of samples of the ``serving_default`` signature.
    :param serving_seed: its fixed seed (an int, or a pair of ints).
    :return: ``path``.
    :raises TypeError: ``model`` is not a DeepGP, or an argument of the wrong type.
    :raises ValueError: names or a transform that do not match the model.
    :raises FileExistsError: ``path`` exists and ``overwrite`` is False, or it is not a saved model.
    :raises NotADirectoryError: ``path``'s parent is a file (missing parents are created).
    """
    if not isinstance(model, DeepGP):
        raise TypeError(f"model must be a deepgp_gi.DeepGP, got {type(model).__name__}")
    if not isinstance(overwrite, (bool, np.bool_)):
        raise TypeError(f"overwrite must be True or False, got {overwrite!r}")
    serving_samples = check_positive_int(serving_samples, "serving_samples")
    given, target = _check_target(path)
    _check_replaceable(given, target, bool(overwrite))
    record = _record(
        model, transform, input_names, output_names, class_names, serving_samples, serving_seed
    )
    exported = ExportedModel(model, transform, serving_samples, serving_seed)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    staging = tempfile.mkdtemp(
        prefix=f".{os.path.basename(target)}.", suffix=".partial", dir=os.path.dirname(target)
    )
    try:
        _export(exported, staging)
        _write_record(record, staging)
        _move_into_place(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return given


# ============================================================================ reading
def _release(version: str) -> Tuple[int, ...]:
    numbers = re.match(r"^(\d+(?:\.\d+)*)", str(version))
    if numbers is None:
        raise ValueError(f"unreadable release number {version!r}")
    return tuple(int(p) for p in numbers.group(1).split("."))


def read_record(path) -> dict:
    """The JSON record of the saved model at ``path``, checked.

    :raises FileNotFoundError: ``path`` does not exist.
    :raises ValueError: ``path`` is not a saved model of this library (no record, or a foreign or
        unreadable one), or one of another format version or of a release older than
        :data:`OLDEST_READABLE_RELEASE` (the message names the versions).
    """
    from .version import __version__

    given = os.fspath(path)
    if not os.path.exists(given):
        raise FileNotFoundError(f"no saved model at {given!r}: it does not exist")
    if not os.path.isdir(given):
        raise ValueError(f"{given!r} is not a saved model: it is a file, not a directory")
    record_path = os.path.join(given, RECORD_FILE)
    if not os.path.isfile(record_path):
        raise ValueError(f"{given!r} is not a deepgp_gi saved model: it has no {RECORD_FILE}")
    try:
        with open(record_path) as fh:
            record = json.load(fh)
    except (OSError, ValueError) as err:
        raise ValueError(f"{given!r}: its {RECORD_FILE} cannot be read ({err})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT_NAME:
        raise ValueError(
            f"{given!r} is not a deepgp_gi saved model: its {RECORD_FILE} is not a {FORMAT_NAME!r} "
            "record"
        )
    saved_by = record.get("deepgp_gi_version", "unknown")
    version = record.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{given!r} was saved in format version {version!r} by deepgp_gi {saved_by}; this "
            f"release (deepgp_gi {__version__}) reads format version {FORMAT_VERSION} only"
        )
    try:
        too_old = _release(saved_by) < _release(OLDEST_READABLE_RELEASE)
    except ValueError:
        too_old = True
    if too_old:
        raise ValueError(
            f"{given!r} was saved by deepgp_gi {saved_by}, older than {OLDEST_READABLE_RELEASE}, "
            f"the oldest release whose models deepgp_gi {__version__} reads"
        )
    return record


def load(path) -> "LoadedModel":
    """The saved model at ``path`` (:func:`save`), ready to predict.

    :raises FileNotFoundError: ``path`` does not exist.
    :raises ValueError: ``path`` is not a saved model, or one this release does not read
        (:func:`read_record`).
    """
    record = read_record(path)
    return LoadedModel(os.fspath(path), record, tf.saved_model.load(os.fspath(path)))


class LoadedModel:
    """A saved model, loaded (:func:`load`): the predictions of the model it was saved from.

    With the same ``seed`` each method returns what the model's method of the same name returned
    (in the data's units when the model was saved with a ``transform``). ``seed=None`` draws a
    fresh seed per call.

    :ivar path: the directory it was loaded from.
    :ivar record: the saved model's JSON record (a dict).
    :ivar transform: the :class:`~deepgp_gi.transforms.Standardisation` it applies, or ``None``.
    """

    def __init__(self, path: str, record: dict, saved):
        self.path, self.record, self._saved = path, record, saved
        self._signatures = saved.signatures
        self.transform = (
            None
            if record.get("transform") is None
            else Standardisation.from_json(record["transform"])
        )
        self._dtype = tf.as_dtype(record["dtype"])

    def __repr__(self) -> str:
        r = self.record
        return (
            f"LoadedModel({self.path!r}: {r['kind']} {r['family']!r}, depth {r['depth']}, "
            f"inputs {r['input_shape']}, saved by deepgp_gi {r['deepgp_gi_version']})"
        )

    # ------------------------------------------------------------------ what the record says
    @property
    def family(self) -> str:
        return self.record["family"]

    @property
    def kind(self) -> str:
        return self.record["kind"]

    @property
    def is_classifier(self) -> bool:
        return bool(self.record["classifier"])

    @property
    def input_names(self) -> Optional[List[str]]:
        return self.record["input_names"]

    @property
    def output_names(self) -> List[str]:
        return self.record["output_names"]

    @property
    def class_names(self) -> Optional[List[str]]:
        return self.record["class_names"]

    @property
    def serving_samples(self) -> int:
        return int(self.record["serving"]["num_samples"])

    # ------------------------------------------------------------------ argument checks
    def _inputs(self, X, name: str = "Xnew") -> tf.Tensor:
        shape = tuple(self.record["input_shape"])
        spec = {"columns": shape[0]} if len(shape) == 1 else {"item_shape": shape}
        return as_data_array(X, name, self._dtype, **spec)

    def _draw_arguments(self, num_samples, seed) -> Tuple[tf.Tensor, tf.Tensor]:
        num_samples = check_positive_int(num_samples, "num_samples")
        if num_samples >= 2**31:
            raise ValueError(f"num_samples must be below 2**31, got {num_samples}")
        if seed is None:
            seed = np.random.default_rng().integers(-(2**63), 2**63 - 1, size=2, dtype=np.int64)
        return tf.constant(num_samples, tf.int32), tf.constant(seed_pair(seed))

    def _predict(self, Xnew, num_samples, seed) -> Dict[str, tf.Tensor]:
        X = self._inputs(Xnew)
        S, s = self._draw_arguments(num_samples, seed)
        return self._signatures["predict"](inputs=X, num_samples=S, seed=s)

    # ------------------------------------------------------------------ predictions
    def predict_f(
        self, Xnew, num_samples: int = DEFAULT_PREDICT_SAMPLES, seed=None
    ) -> Tuple[tf.Tensor, tf.Tensor]:
        """Mean and variance ``[N, P]`` of the last layer's mixture over ``num_samples`` samples
        (the model's ``predict_f``)."""
        out = self._predict(Xnew, num_samples, seed)
        return out["f_mean"], out["f_variance"]

    def predict_y(
        self, Xnew, num_samples: int = DEFAULT_PREDICT_SAMPLES, seed=None
    ) -> Tuple[tf.Tensor, tf.Tensor]:
        """Mean and variance ``[N, P]`` of the predictive mixture, likelihood noise included (the
        model's ``predict_y``)."""
        out = self._predict(Xnew, num_samples, seed)
        return out["y_mean"], out["y_variance"]

    def predict_y_components(
        self, Xnew, num_samples: int = DEFAULT_PREDICT_SAMPLES, seed=None
    ) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """The predictive mixture's components: per-sample mean and variance ``[S, N, P]``,
        likelihood noise included, and their log-weights ``[S]`` (``-log S`` each unless the family
        weights its samples); ``predict_y`` is their mixture's moments."""
        out = self._predict(Xnew, num_samples, seed)
        return out["y_component_mean"], out["y_component_variance"], out["y_component_log_weight"]

    def predict_log_density(
        self, data, num_samples: int = DEFAULT_PREDICT_SAMPLES, seed=None
    ) -> tf.Tensor:
        """``[N]``: the log predictive density of each row of ``data = (Xnew, Ynew)`` (the
        model's ``predict_log_density``)."""
        if not isinstance(data, (tuple, list)) or len(data) != 2:
            raise TypeError(f"data must be a pair (Xnew, Ynew), got {type(data).__name__}")
        X = self._inputs(data[0])
        Y = as_data_array(data[1], "Ynew", self._dtype, columns=int(self.record["target_dim"]))
        if X.shape[0] != Y.shape[0]:
            raise ValueError(f"Xnew has {X.shape[0]} rows but Ynew has {Y.shape[0]}")
        S, s = self._draw_arguments(num_samples, seed)
        return self._signatures["log_density"](inputs=X, targets=Y, num_samples=S, seed=s)[
            "log_density"
        ]

    def predict_proba(
        self, Xnew, num_samples: int = DEFAULT_PREDICT_SAMPLES, seed=None
    ) -> tf.Tensor:
        """Class probabilities ``[N, C]`` of a classifier (as
        :func:`~deepgp_gi.metrics.predict_class_probabilities`).

        :raises TypeError: the model is not a classifier.
        """
        if not self.is_classifier:
            raise TypeError(
                f"predict_proba needs a classifier; this model has a {self.record['likelihood']} "
                "likelihood (use predict_y)"
            )
        return self._predict(Xnew, num_samples, seed)["probabilities"]

    def serve(self, Xnew) -> Dict[str, tf.Tensor]:
        """What the ``serving_default`` signature returns for ``Xnew`` (the fixed number of samples
        and seed of the record's ``serving`` entry)."""
        return self._signatures["serving_default"](inputs=self._inputs(Xnew))
