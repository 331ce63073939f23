"""A model's predictions as TensorFlow functions that a SavedModel keeps (:func:`deepgp_gi.save`).

:class:`ExportedModel` holds the model's variables and three concrete functions, traced once with
fixed input signatures so that a process that has never imported :mod:`deepgp_gi` (TF Serving,
``tf.saved_model.load``) can call them:

* ``predict`` -- ``(inputs [N, ...], num_samples [] int32, seed [2] int64)`` ->
  ``f_mean``, ``f_variance``, ``y_mean``, ``y_variance`` ``[N, P]`` (``predict_f`` and
  ``predict_y``), ``y_component_mean``, ``y_component_variance`` ``[S, N, P]`` and
  ``y_component_log_weight`` ``[S]`` (the predictive mixture's components, likelihood noise
  included, and their weights) and, for a classifier, ``probabilities`` ``[N, C]``;
* ``log_density`` -- ``(inputs, targets [N, P_y], num_samples, seed)`` -> ``log_density`` ``[N]``
  (``predict_log_density``);
* ``serving_default`` -- ``(inputs)`` -> ``mean``, ``variance`` ``[N, P]`` (the predictive
  mixture's moments), or ``probabilities`` ``[N, C]`` for a classifier, with a fixed number of
  samples and a fixed seed.

The functions call the model's own ``predict_f``, ``predict_y`` and ``predict_log_density``.
Seeded draws are stateless (:class:`~deepgp_gi.noise.SeededNoise`), so a traced function given
the seed ``[s, 0]`` draws what the model draws eagerly given the seed ``s``. All outputs are in the
data's units when a :class:`~deepgp_gi.transforms.Standardisation` is given.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import gpflow
import numpy as np
import tensorflow as tf

from .likelihoods import predict_mean_and_var
from .models import DeepGP, likelihood_rows
from .transforms import Standardisation

__all__ = ["ExportedModel", "classification_kind", "seed_pair", "SIGNATURES"]

#: The signatures of an exported model, by name: their input names.
SIGNATURES = {
    "serving_default": ("inputs",),
    "predict": ("inputs", "num_samples", "seed"),
    "log_density": ("inputs", "targets", "num_samples", "seed"),
}


def classification_kind(likelihood) -> Optional[str]:
    """``"categorical"`` (Softmax, robust-max MultiClass), ``"bernoulli"`` or ``None`` (not a
    classifier)."""
    if isinstance(likelihood, (gpflow.likelihoods.Softmax, gpflow.likelihoods.MultiClass)):
        return "categorical"
    if isinstance(likelihood, gpflow.likelihoods.Bernoulli):
        return "bernoulli"
    return None


def seed_pair(seed) -> np.ndarray:
    """The ``[2]`` int64 seed of a traced function for the seed a model takes: an int ``s`` is
    ``[s, 0]`` (as :class:`~deepgp_gi.noise.SeededNoise` reads it), a pair is itself.

    :raises TypeError: ``seed`` is neither an int nor a pair of ints.
    :raises ValueError: a pair of another length or outside int64.
    """
    if isinstance(seed, (bool, np.bool_)):
        raise TypeError(f"seed must be an int or a pair of ints, got {seed!r}")
    if isinstance(seed, (int, np.integer)):
        seed = [int(seed), 0]
    if isinstance(seed, (tf.Tensor, tf.Variable)):
        seed = seed.numpy()
    arr = np.asarray(seed)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"seed must be an int or a pair of ints, got {seed!r}")
    if arr.shape != (2,):
        raise ValueError(f"seed must be an int or a pair of ints, got shape {list(arr.shape)}")
    if any(not -(2**63) <= int(v) < 2**63 for v in arr):
        raise ValueError(f"seed entries must fit in a 64-bit integer, got {arr.tolist()}")
    return arr.astype(np.int64)


def _probabilities(likelihood, y_mean: tf.Tensor) -> tf.Tensor:
    """Class probabilities ``[N, C]`` from the predictive mean (as
    :func:`~deepgp_gi.metrics.predict_class_probabilities`): robust-max rows renormalised,
    a Bernoulli column ``p`` as ``[1 - p, p]``."""
    if isinstance(likelihood, gpflow.likelihoods.MultiClass):
        return y_mean / tf.reduce_sum(y_mean, axis=-1, keepdims=True)
    if isinstance(likelihood, gpflow.likelihoods.Bernoulli):
        return tf.concat([1.0 - y_mean, y_mean], axis=-1)
    return y_mean


class ExportedModel(tf.Module):
    """The model's variables and prediction functions (module docs), ready for
    ``tf.saved_model.save(exported, path, signatures=exported.signatures())``.

    :param model: a :class:`~deepgp_gi.DeepGP` (or :class:`~deepgp_gi.LatentDeepGP`).
    :param transform: ``None``, or the :class:`~deepgp_gi.transforms.Standardisation` of the
        training data (inputs ``[D]``; targets ``[P_y]``, or none for a classifier).
    :param serving_samples: the number of samples of ``serving_default``.
    :param serving_seed: its fixed seed (an int or a pair, :func:`seed_pair`).
    :raises TypeError: ``model`` is not a DeepGP.
    :raises ValueError: a transform whose sizes do not match the model's inputs or targets, or one
        for image inputs.
    """

    def __init__(
        self,
        model: DeepGP,
        transform: Optional[Standardisation] = None,
        serving_samples: int = 100,
        serving_seed=0,
    ):
        super().__init__(name="deepgp_gi_model")
        if not isinstance(model, DeepGP):
            raise TypeError(f"model must be a deepgp_gi.DeepGP, got {type(model).__name__}")
        self._check_transform(model, transform)
        # every variable the functions read, tracked so that the SavedModel holds their values
        self.model_variables = list(model.variables)
        # the model itself is not a dependency: the SavedModel keeps its variables and
        # functions only
        object.__setattr__(self, "_model", model)
        self._transform = transform
        self._kind = classification_kind(model.likelihood)
        self._serving_samples = int(serving_samples)
        self._serving_seed = seed_pair(serving_seed)
        object.__setattr__(
            self, "_signatures", None
        )  # traced by signatures(); not dependencies either

    @staticmethod
    def _check_transform(model: DeepGP, transform: Optional[Standardisation]) -> None:
        if transform is None:
            return
        if not isinstance(transform, Standardisation):
            raise TypeError(
                "transform must be a deepgp_gi.transforms.Standardisation, got "
                f"{type(transform).__name__}"
            )
        if len(model.input_shape) != 1:
            raise ValueError(
                f"transform applies to flat inputs [N, D]; this model takes images of shape "
                f"{tuple(model.input_shape)}"
            )
        if transform.input_mean.size != model.input_dim:
            raise ValueError(
                f"transform has {transform.input_mean.size} input columns but the model takes "
                f"{model.input_dim}"
            )
        if transform.has_targets:
            if classification_kind(model.likelihood) is not None:
                raise ValueError(
                    "transform of a classifier must not transform its targets (class labels)"
                )
            cols = model.observation_columns()
            if transform.target_mean.size != cols:
                raise ValueError(
                    f"transform has {transform.target_mean.size} target columns but the model "
                    f"predicts {cols}"
                )

    def signatures(self) -> Dict[str, tf.types.experimental.ConcreteFunction]:
        """The concrete functions to save as signatures (:data:`SIGNATURES`), traced on the first
        call. They are not attributes of the module: a SavedModel keeps them as its signatures only
        (AutoGraph converts the code, so a posterior may read the sample count with ``int()``)."""
        if self._signatures is None:
            model = self._model
            inputs = tf.TensorSpec((None,) + tuple(model.input_shape), model.dtype, name="inputs")
            targets = tf.TensorSpec(
                (None, model.observation_columns()), model.dtype, name="targets"
            )
            samples = tf.TensorSpec([], tf.int32, name="num_samples")
            seed = tf.TensorSpec([2], tf.int64, name="seed")
            serving_seed = tf.constant(self._serving_seed)

            def trace(fn, *spec):
                return tf.function(fn, input_signature=list(spec)).get_concrete_function()

            signatures = {
                "serving_default": trace(
                    lambda inputs: self._serve(inputs, self._serving_samples, serving_seed), inputs
                ),
                "predict": trace(self._predict, inputs, samples, seed),
                "log_density": trace(self._log_density, inputs, targets, samples, seed),
            }
            object.__setattr__(self, "_signatures", signatures)
        return self._signatures

    # ------------------------------------------------------------------ the traced bodies
    def _inputs(self, X: tf.Tensor) -> tf.Tensor:
        return X if self._transform is None else self._transform.inputs(X)

    def _components(self, Xm: tf.Tensor, num_samples, seed) -> Dict[str, tf.Tensor]:
        """The predictive mixture's components at the model-unit inputs ``Xm``: per-sample mean and
        variance ``[S, N, P]`` (likelihood noise included) and their log-weights ``[S]`` (``-log S``
        each unless the family weights its samples). Their mixture's moments are ``predict_y``'s."""
        model = self._model
        prop = model.propagate(Xm, num_samples, seed)
        mean, var = predict_mean_and_var(
            model.likelihood, likelihood_rows(Xm), *model.likelihood_moments(prop)
        )
        log_weights = model.posterior.mixture_log_weights()
        S = tf.shape(mean)[0]
        if log_weights is None:
            log_weights = tf.fill([S], -tf.math.log(tf.cast(S, mean.dtype)))
        return {
            "y_component_mean": mean,
            "y_component_variance": var,
            "y_component_log_weight": tf.cast(log_weights, mean.dtype),
        }

    def _to_data_units(self, out: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
        t = self._transform
        if t is None:
            return out
        return {
            key: t.variance(value)
            if key.endswith("variance")
            else value
            if key.endswith("weight")
            else t.mean(value)
            for key, value in out.items()
        }

    def _predict(self, inputs, num_samples, seed):
        model, Xm = self._model, self._inputs(inputs)
        f_mean, f_var = model.predict_f(Xm, num_samples, seed)
        y_mean, y_var = model.predict_y(Xm, num_samples, seed)
        out = {
            "f_mean": f_mean,
            "f_variance": f_var,
            "y_mean": y_mean,
            "y_variance": y_var,
            **self._components(Xm, num_samples, seed),
        }
        out = self._to_data_units(out)
        if self._kind is not None:
            out["probabilities"] = _probabilities(model.likelihood, out["y_mean"])
        return out

    def _log_density(self, inputs, targets, num_samples, seed):
        Y = targets if self._transform is None else self._transform.targets(targets)
        logp = self._model.predict_log_density((self._inputs(inputs), Y), num_samples, seed)
        if self._transform is not None:
            logp = self._transform.log_density(logp)
        return {"log_density": logp}

    def _serve(self, inputs, num_samples: int, seed: tf.Tensor):
        mean, var = self._model.predict_y(self._inputs(inputs), num_samples, seed)
        out = self._to_data_units({"mean": mean, "variance": var})
        if self._kind is not None:
            return {"probabilities": _probabilities(self._model.likelihood, out["mean"])}
        return out

    def output_names(self) -> List[str]:
        """The outputs of ``serving_default``."""
        return ["probabilities"] if self._kind is not None else ["mean", "variance"]
