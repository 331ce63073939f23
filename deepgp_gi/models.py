"""The deep GP model: layers (the prior), a likelihood, and an approximate posterior."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import gpflow
import numpy as np
import tensorflow as tf
from gpflow.models.model import BayesianModel
from gpflow.models.training_mixins import ExternalDataTrainingLossMixin

from .layers import GPLayer
from .likelihoods import check_targets, expected_log_likelihood, mixture_log_density, predict_mean_and_var
from .noise import NoiseLike
from .posteriors import POSTERIORS, DeepPosterior
from .validation import as_data_array, check_data_pair, check_positive_int

__all__ = ["DeepGP"]


class DeepGP(BayesianModel, ExternalDataTrainingLossMixin):
    """A deep GP (or a BNN, a deep GP with the weight-induced kernel).

    :param layers: the layers, input to output; ``layers[-1].output_dim`` is the number of
        latent functions the likelihood sees.
    :param likelihood: any GPflow likelihood (applied over the sample axis).
    :param posterior: a :class:`~deepgp_gi.posteriors.DeepPosterior` built on ``layers``, or the
        name of one that can be built from the layers alone (e.g. ``"mean_field"``).
    :param num_data: the training-set size N; a minibatch ELBO is rescaled by ``N / batch``.
        ``None`` means every batch is the whole data set.
    :param num_samples: default S for ``training_loss`` (used by GPflow optimisers).
    """

    def __init__(
        self,
        layers: Sequence[GPLayer],
        likelihood: gpflow.likelihoods.Likelihood,
        posterior: Union[str, DeepPosterior] = "mean_field",
        num_data: Optional[int] = None,
        num_samples: int = 1,
        name: Optional[str] = None,
    ):
        super().__init__(name=name)
        layers = list(layers)
        if len(layers) < 1:
            raise ValueError("layers must contain at least one layer (depth >= 1)")
        for i, layer in enumerate(layers):
            if not isinstance(layer, gpflow.Module) or not hasattr(layer, "output_dim"):
                raise TypeError(f"layers[{i}] is a {type(layer).__name__}, not a deepgp_gi layer")
        if not isinstance(likelihood, gpflow.likelihoods.Likelihood):
            raise TypeError(f"likelihood must be a gpflow.likelihoods.Likelihood, got {type(likelihood).__name__}")
        if isinstance(posterior, str):
            if posterior not in POSTERIORS:
                raise ValueError(f"unknown posterior {posterior!r}; choose one of {', '.join(map(repr, POSTERIORS))}")
            posterior = POSTERIORS[posterior](layers)
        if not isinstance(posterior, DeepPosterior):
            raise TypeError(f"posterior must be a DeepPosterior or a name, got {type(posterior).__name__}")
        if len(posterior.layers) != len(layers) or any(a is not b for a, b in zip(posterior.layers, layers)):
            raise ValueError("posterior was built on different layers than the ones given to DeepGP")
        latent = getattr(likelihood, "latent_dim", None)
        if latent is not None and latent != layers[-1].output_dim:
            raise ValueError(
                f"the likelihood expects {latent} latent functions but the last layer has output_dim "
                f"{layers[-1].output_dim}"
            )
        if num_data is not None:
            num_data = check_positive_int(num_data, "num_data")
        self.layers = layers
        self.likelihood = likelihood
        self.posterior = posterior
        self.num_data = num_data
        self.num_samples = check_positive_int(num_samples, "num_samples")

    # ------------------------------------------------------------------ shapes and checks
    @property
    def input_dim(self) -> int:
        return self.layers[0].input_dim

    @property
    def output_dim(self) -> int:
        return self.layers[-1].output_dim

    @property
    def depth(self) -> int:
        return len(self.layers)

    @property
    def dtype(self) -> tf.DType:
        return self.trainable_variables[0].dtype if self.trainable_variables else gpflow.default_float()

    def _observation_columns(self) -> int:
        obs = getattr(self.likelihood, "observation_dim", None)
        if obs is not None:
            return obs
        if isinstance(self.likelihood, (gpflow.likelihoods.Softmax, gpflow.likelihoods.MultiClass)):
            return 1
        return self.output_dim

    def check_inputs(self, X, name: str = "Xnew") -> tf.Tensor:
        """Validate inputs ``[N, D]`` and convert them to the model's dtype."""
        return as_data_array(X, name, self.dtype, columns=self.input_dim)

    def check_data(self, data, names: Tuple[str, str] = ("X", "Y")) -> Tuple[tf.Tensor, tf.Tensor]:
        """Validate ``(X, Y)``: ranks, column counts, equal lengths, finite values, targets."""
        if not isinstance(data, (tuple, list)) or len(data) != 2:
            raise TypeError(f"data must be a pair (X, Y), got {type(data).__name__}")
        X = as_data_array(data[0], names[0], self.dtype, columns=self.input_dim)
        cols = self._observation_columns()
        Y = as_data_array(data[1], names[1], self.dtype)
        if Y.shape[-1] is not None and Y.shape[-1] != cols:
            raise ValueError(f"{names[1]} has {Y.shape[-1]} columns but the likelihood expects {cols}")
        check_data_pair(X, Y, *names)
        if tf.executing_eagerly():
            check_targets(self.likelihood, Y.numpy(), names[1])
        return X, Y

    # ------------------------------------------------------------------ objective
    def propagate(self, X, num_samples: int = 1, noise: NoiseLike = None):
        """``posterior.propagate`` (see :class:`~deepgp_gi.posteriors.Propagation`)."""
        return self.posterior.propagate(X, num_samples, noise)

    def elbo(self, data, num_samples: int = 1, noise: NoiseLike = None) -> tf.Tensor:
        """Unbiased estimate of the full-data ELBO (a sum over the data set).

        With ``num_data`` set, a minibatch's expected log-likelihood is rescaled by
        ``num_data / batch``. Averages the per-sample estimate over ``num_samples`` samples.
        """
        return tf.reduce_mean(self.elbo_per_sample(data, num_samples, noise))

    def elbo_per_sample(self, data, num_samples: int = 1, noise: NoiseLike = None) -> tf.Tensor:
        """The ELBO estimate of each of the S joint samples, ``[S]``."""
        X, Y = self.check_data(data)
        prop = self.posterior.propagate(X, num_samples, noise)
        ell = expected_log_likelihood(self.likelihood, X, prop.mean, prop.var, Y)  # [S, N]
        ell = tf.reduce_sum(ell, axis=-1)
        if self.num_data is not None:
            batch = tf.cast(tf.shape(X)[0], ell.dtype)
            ell = ell * (tf.cast(self.num_data, ell.dtype) / batch)
        return ell - prop.kl

    def maximum_log_likelihood_objective(self, data) -> tf.Tensor:
        return self.elbo(data, self.num_samples)

    # ------------------------------------------------------------------ prediction
    def sample_layers(self, Xnew, num_samples: int = 1, noise: NoiseLike = None) -> List[tf.Tensor]:
        """One ``[S, N, D_l]`` tensor of joint samples per layer."""
        Xnew = self.check_inputs(Xnew)
        return self.posterior.propagate(Xnew, num_samples, noise).samples

    def predict_f_samples(self, Xnew, num_samples: int = 1, noise: NoiseLike = None) -> tf.Tensor:
        """``[S, N, P]`` samples of the last layer's function values."""
        return self.sample_layers(Xnew, num_samples, noise)[-1]

    def predict_f_components(self, Xnew, num_samples: int = 1, noise: NoiseLike = None):
        """The mixture components: per-sample mean and variance ``[S, N, P]`` of the last layer."""
        Xnew = self.check_inputs(Xnew)
        prop = self.posterior.propagate(Xnew, num_samples, noise)
        return prop.mean, prop.var

    def predict_f(self, Xnew, num_samples: int = 1, noise: NoiseLike = None):
        """Mean and variance ``[N, P]`` of the mixture over ``num_samples`` samples."""
        mean, var = self.predict_f_components(Xnew, num_samples, noise)
        return _mixture_moments(mean, var)

    def predict_y(self, Xnew, num_samples: int = 1, noise: NoiseLike = None):
        """Mean and variance ``[N, P]`` of the predictive mixture, likelihood noise included."""
        Xnew = self.check_inputs(Xnew)
        mean, var = self.predict_f_components(Xnew, num_samples, noise)
        ymean, yvar = predict_mean_and_var(self.likelihood, Xnew, mean, var)
        return _mixture_moments(ymean, yvar)

    def predict_log_density(self, data, num_samples: int = 1, noise: NoiseLike = None) -> tf.Tensor:
        """``[N]``: ``logsumexp_s log p(y_n | f_n^(s)) - log S`` (each term exact where possible)."""
        X, Y = self.check_data(data, names=("Xnew", "Ynew"))
        prop = self.posterior.propagate(X, num_samples, noise)
        return mixture_log_density(self.likelihood, X, prop.mean, prop.var, Y)


def _mixture_moments(mean: tf.Tensor, var: tf.Tensor):
    """Moments of an equal-weight mixture over the leading axis."""
    mixture_mean = tf.reduce_mean(mean, axis=0)
    second = tf.reduce_mean(var + tf.square(mean), axis=0)
    return mixture_mean, tf.maximum(second - tf.square(mixture_mean), 0.0)
