"""The deep GP model: layers (the prior), a likelihood, and an approximate posterior."""

from __future__ import annotations

import warnings
from typing import List, Optional, Sequence, Tuple, Union

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes
from gpflow.models.model import BayesianModel
from gpflow.models.training_mixins import ExternalDataTrainingLossMixin

from .kernels import shared_parameter_reads
from .layers import GPLayer, ShapedLayer, check_layer_chain
from .likelihoods import (
    check_targets,
    expected_log_likelihood,
    log_mean_exp,
    mixture_log_density,
    mixture_mean,
    predict_mean_and_var,
    predictive_log_density,
)
from .noise import NoiseLike
from .posteriors import DeepPosterior
from .posteriors.base import float_dtype
from .validation import as_data_array, check_choice, check_data_pair, check_positive_int

__all__ = ["DeepGP", "DEFAULT_POSTERIOR", "DEFAULT_PREDICT_SAMPLES", "OBJECTIVES"]

#: The posterior family of ``DeepGP(...)`` and ``build_deep_gp(...)`` when none is named.
DEFAULT_POSTERIOR = "global"

#: Monte Carlo samples of ``predict_f``, ``predict_y``, ``predict_log_density``,
#: ``predict_f_samples`` and ``sample_layers`` when ``num_samples`` is not given (as in
#: :mod:`deepgp_gi.metrics`). Training uses ``num_samples=1`` unless told otherwise.
DEFAULT_PREDICT_SAMPLES = 100

#: The training objectives of :meth:`DeepGP.elbo_terms` (``fit(..., objective=...)``): the ELBO, and
#: the predictive objective (the log predictive density of the training rows under the propagated
#: mixture, minus the KL; Jankowiak et al. 2020).
OBJECTIVES = ("elbo", "predictive")

_SEED_DOC = (
    "``seed``: ``None`` (fresh random draws), an int or ``[2]`` seed (reproducible draws) or a "
    ":class:`~deepgp_gi.noise.NoiseSource`"
)


def seed_or_deprecated_noise(seed, noise, where: str):
    """``noise=`` is the deprecated name of ``seed=`` (in GPflow, "noise" is the likelihood's)."""
    if noise is None:
        return seed
    if seed is not None:
        raise TypeError(f"{where}: give seed= only (noise= is its deprecated alias)")
    warnings.warn(
        f"{where}: the keyword noise= is deprecated; use seed=", DeprecationWarning, stacklevel=3
    )
    return noise


class DeepGP(BayesianModel, ExternalDataTrainingLossMixin):
    """A deep GP (or a BNN, a deep GP with the weight-induced kernel).

    :param layers: the layers, input to output; ``layers[-1].output_dim`` is the number of
        latent functions the likelihood sees.
    :param likelihood: any GPflow likelihood (applied over the sample axis).
    :param posterior: a :class:`~deepgp_gi.posteriors.DeepPosterior` built on ``layers``, or a
        family name from :mod:`deepgp_gi.families` (default ``"global"``, as ``build_deep_gp``),
        built from the layers with the class's default values (the builders initialise from
        data instead).
    :param num_data: the training-set size N; a minibatch ELBO is rescaled by ``N / batch``.
        ``None`` means every batch is the whole data set.
    :param num_samples: default S for ``training_loss`` (used by GPflow optimisers).
    """

    def __init__(
        self,
        layers: Sequence[GPLayer],
        likelihood: gpflow.likelihoods.Likelihood,
        posterior: Union[str, DeepPosterior] = DEFAULT_POSTERIOR,
        num_data: Optional[int] = None,
        num_samples: int = 1,
        name: Optional[str] = None,
    ):
        super().__init__(name=name)
        if not isinstance(likelihood, gpflow.likelihoods.Likelihood):
            raise TypeError(
                "likelihood must be a gpflow.likelihoods.Likelihood, got "
                f"{type(likelihood).__name__}"
            )
        if isinstance(posterior, str):
            from .families import posterior_class

            layers = check_layer_chain(layers)
            posterior = posterior_class(posterior, layers)(layers)
        if not isinstance(posterior, DeepPosterior):
            raise TypeError(
                f"posterior must be a DeepPosterior or a name, got {type(posterior).__name__}"
            )
        layers = list(layers)
        if len(posterior.layers) != len(layers) or any(
            a is not b for a, b in zip(posterior.layers, layers)
        ):
            raise ValueError(
                "posterior was built on different layers than the ones given to DeepGP"
            )
        latent = getattr(likelihood, "latent_dim", None)
        if latent is not None and latent != layers[-1].output_dim:
            raise ValueError(
                f"the likelihood expects {latent} latent functions but the last layer has "
                f"output_dim {layers[-1].output_dim}"
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
    def input_shape(self) -> Tuple[int, ...]:
        """The shape of one input row: ``(D,)``, or ``(H, W, C)`` for a convolutional network."""
        first = self.layers[0]
        return tuple(first.input_shape) if isinstance(first, ShapedLayer) else (self.input_dim,)

    @property
    def output_dim(self) -> int:
        return self.layers[-1].output_dim

    @property
    def depth(self) -> int:
        return len(self.layers)

    @property
    def dtype(self) -> tf.DType:
        """The dtype of the model's parameters, trainable or frozen (``float_dtype``)."""
        return float_dtype(self)

    def observation_columns(self) -> int:
        """The number of columns of ``Y`` the likelihood takes (1 for class labels)."""
        obs = getattr(self.likelihood, "observation_dim", None)
        if obs is not None:
            return obs
        if isinstance(self.likelihood, (gpflow.likelihoods.Softmax, gpflow.likelihoods.MultiClass)):
            return 1
        return self.output_dim

    def check_inputs(self, X, name: str = "Xnew") -> tf.Tensor:
        """Validate inputs ``[N, D]`` (``[N, H, W, C]`` for images) and convert them to the model's
        dtype."""
        return as_data_array(X, name, self.dtype, **self._input_spec())

    def _input_spec(self) -> dict:
        shape = self.input_shape
        return {"columns": self.input_dim} if len(shape) == 1 else {"item_shape": shape}

    def check_data(self, data, names: Tuple[str, str] = ("X", "Y")) -> Tuple[tf.Tensor, tf.Tensor]:
        """Validate ``(X, Y)``: ranks, column counts, equal lengths, finite values, targets."""
        if not isinstance(data, (tuple, list)) or len(data) != 2:
            raise TypeError(f"data must be a pair (X, Y), got {type(data).__name__}")
        X = as_data_array(data[0], names[0], self.dtype, **self._input_spec())
        cols = self.observation_columns()
        Y = as_data_array(data[1], names[1], self.dtype)
        if Y.shape[-1] is not None and Y.shape[-1] != cols:
            raise ValueError(
                f"{names[1]} has {Y.shape[-1]} columns but the likelihood expects {cols}"
            )
        check_data_pair(X, Y, *names)
        if tf.executing_eagerly():
            check_targets(self.likelihood, Y.numpy(), names[1])
        else:  # a traced step may have a loose signature: restore the static row shapes
            X = tf.ensure_shape(X, (None,) + self.input_shape)
            Y = tf.ensure_shape(Y, (None, cols))
        return X, Y

    # ------------------------------------------------------------------ objective
    def _propagate(self, X, num_samples, seed):
        """``posterior.propagate`` with each kernel parameter read once
        (:func:`~deepgp_gi.kernels.shared_parameter_reads`)."""
        with shared_parameter_reads():
            return self.posterior.propagate(X, num_samples, seed)

    @check_shapes("X: [N, D, image_shape...]")
    def propagate(
        self, X, num_samples: int = 1, seed: NoiseLike = None, *, noise: NoiseLike = None
    ):
        """``posterior.propagate`` (see :class:`~deepgp_gi.posteriors.Propagation`)."""
        return self._propagate(X, num_samples, seed_or_deprecated_noise(seed, noise, "propagate"))

    @check_shapes("return: []")
    def elbo(
        self,
        data,
        num_samples: int = 1,
        seed: NoiseLike = None,
        *,
        noise: NoiseLike = None,
        **options,
    ) -> tf.Tensor:
        """Unbiased estimate of the full-data ELBO (a sum over the data set).

        With ``num_data`` set, a minibatch's expected log-likelihood is rescaled by
        ``num_data / batch``. Averages the per-sample estimate over ``num_samples`` samples
        (default 1, the training setting). ``seed``: see :meth:`predict_f`. ``options``: keyword
        arguments of :meth:`elbo_terms` (e.g. a :class:`~deepgp_gi.latent.LatentDeepGP`'s
        ``importance_samples``, whose bound this then is).
        """
        return tf.reduce_mean(
            self.elbo_per_sample(
                data, num_samples, seed_or_deprecated_noise(seed, noise, "elbo"), **options
            )
        )

    @check_shapes("return: [S]")
    def elbo_per_sample(
        self,
        data,
        num_samples: int = 1,
        seed: NoiseLike = None,
        *,
        noise: NoiseLike = None,
        **options,
    ) -> tf.Tensor:
        """The ELBO estimate of each of the S joint samples, ``[S]``: ``ell - kl`` of
        :meth:`elbo_terms` (``options``: its keyword arguments)."""
        ell, kl = self.elbo_terms(
            data, num_samples, seed_or_deprecated_noise(seed, noise, "elbo_per_sample"), **options
        )
        return ell - kl

    @check_shapes("return[0]: [S]", "return[1]: [S]")
    def elbo_terms(
        self,
        data,
        num_samples: int = 1,
        seed: NoiseLike = None,
        *,
        batch_size=None,
        objective: str = "elbo",
    ) -> Tuple[tf.Tensor, tf.Tensor]:
        """The two terms of the ELBO per joint sample: ``(ell [S], kl [S])`` with ELBO = ell - kl.

        ``ell`` is the expected log-likelihood summed over the batch, rescaled by
        ``num_data / batch`` when ``num_data`` is set (an unbiased estimate of the full-data sum);
        ``kl`` is the posterior's regulariser of the same sample (the analytic KL, or the sampled
        ``log q - log p``; see :class:`~deepgp_gi.posteriors.Propagation`). Both come from the
        same draws, so a tempered objective ``ell - beta * kl`` (``fit(..., kl_schedule=...)``)
        and the ELBO share their noise. ``seed``: see :meth:`predict_f`.

        ``batch_size``: the number of rows of the minibatch that ``data`` is a part of (default:
        the rows of ``data``). A data-parallel replica holding a block of a batch passes the whole
        batch's size, so its ``ell`` is its share of the batch's and the replicas' shares sum to
        it (a replica with no rows contributes 0).

        ``objective``: ``"elbo"`` (default) or ``"predictive"``, the predictive objective
        (Jankowiak et al. 2020): ``ell`` is then ``sum_n log mean_s p(y_n | sample s)``, the
        log predictive density of each row under the mixture of the propagated samples (the last
        layer's ``f`` integrated out), the same for every sample; ``mean_s(ell - kl)`` is the
        objective. A family whose samples carry mixture weights
        (:meth:`~deepgp_gi.posteriors.DeepPosterior.mixture_log_weights`) is weighted in both:
        with the ELBO, ``ell_s`` is ``S w_s`` times the sample's expected log-likelihood, so that
        the mean over samples is the weighted sum.
        """
        objective = check_choice(objective, "objective", OBJECTIVES)
        X, Y = self.check_data(data)
        prop = self._propagate(X, num_samples, seed)
        log_weights = self.posterior.mixture_log_weights()
        if objective == "predictive":
            per_row = log_mean_exp(self.sample_log_density(X, Y, prop), log_weights)  # [N]
            ell = tf.broadcast_to(tf.reduce_sum(per_row), tf.shape(prop.kl))
        else:
            ell = expected_log_likelihood(
                self.likelihood, likelihood_rows(X), *self.likelihood_moments(prop), Y
            )
            ell = tf.reduce_sum(ell, axis=-1)  # [S]
            if log_weights is not None:
                ell = (
                    ell
                    * tf.cast(tf.shape(ell)[0], ell.dtype)
                    * tf.exp(tf.cast(log_weights, ell.dtype))
                )
        if self.num_data is not None:
            batch = tf.shape(X)[0] if batch_size is None else batch_size
            ell = ell * (tf.cast(self.num_data, ell.dtype) / tf.cast(batch, ell.dtype))
        return ell, tf.broadcast_to(prop.kl, tf.shape(ell))

    def maximum_log_likelihood_objective(self, data) -> tf.Tensor:
        return self.elbo(data, self.num_samples)

    def likelihood_moments(self, prop) -> Tuple[tf.Tensor, tf.Tensor]:
        """What the likelihood integrates over: the last layer's ``(mean, var)``, or, for GPflow's
        Monte Carlo likelihoods (Softmax, ...), the last layer's sample with variance 0. GPflow
        would draw that sample itself from TensorFlow's global generator; taking the one drawn
        with the model's noise source (name ``"f/{L-1}"``) keeps seeded runs reproducible and
        compiled steps equal to plain ones, and gives the same unbiased estimate."""
        if isinstance(self.likelihood, gpflow.likelihoods.MonteCarloLikelihood):
            sample = prop.samples[-1]
            return sample, tf.zeros_like(sample)
        return prop.mean, prop.var

    def sample_log_density(self, X: tf.Tensor, Y: tf.Tensor, prop) -> tf.Tensor:
        """``[S, N]``: ``log p(y_n | sample s)`` with the last layer's ``f`` integrated out of the
        propagation ``prop`` of the rows ``X`` (the terms a sampler's log-likelihood sums; the
        log of their mean over ``s`` is :meth:`predict_log_density`)."""
        return predictive_log_density(
            self.likelihood, likelihood_rows(X), *self.likelihood_moments(prop), Y
        )

    # ------------------------------------------------------------------ prediction
    def sample_layers(
        self,
        Xnew,
        num_samples: int = DEFAULT_PREDICT_SAMPLES,
        seed: NoiseLike = None,
        *,
        noise: NoiseLike = None,
    ) -> List[tf.Tensor]:
        """One ``[S, N, D_l]`` tensor of joint samples per layer."""
        Xnew = self.check_inputs(Xnew)
        return self._propagate(
            Xnew, num_samples, seed_or_deprecated_noise(seed, noise, "sample_layers")
        ).samples

    @check_shapes("return: [S, N, P]")
    def predict_f_samples(
        self,
        Xnew,
        num_samples: int = DEFAULT_PREDICT_SAMPLES,
        seed: NoiseLike = None,
        *,
        noise: NoiseLike = None,
    ) -> tf.Tensor:
        """``[S, N, P]`` samples of the last layer's function values."""
        return self.sample_layers(
            Xnew, num_samples, seed_or_deprecated_noise(seed, noise, "predict_f_samples")
        )[-1]

    @check_shapes("return[0]: [S, N, P]", "return[1]: [S, N, P]")
    def predict_f_components(
        self,
        Xnew,
        num_samples: int = DEFAULT_PREDICT_SAMPLES,
        seed: NoiseLike = None,
        *,
        noise: NoiseLike = None,
    ):
        """The mixture components: per-sample mean and variance ``[S, N, P]`` of the last layer.

        The variance is exactly 0 for the BNN families that sample the last layer's weights
        (see :class:`~deepgp_gi.posteriors.Propagation`)."""
        Xnew = self.check_inputs(Xnew)
        prop = self._propagate(
            Xnew, num_samples, seed_or_deprecated_noise(seed, noise, "predict_f_components")
        )
        return prop.mean, prop.var

    @check_shapes("return[0]: [N, P]", "return[1]: [N, P]")
    def predict_f(
        self,
        Xnew,
        num_samples: int = DEFAULT_PREDICT_SAMPLES,
        seed: NoiseLike = None,
        *,
        noise: NoiseLike = None,
    ):
        """Mean and variance ``[N, P]`` of the mixture over ``num_samples`` samples.

        ``num_samples`` defaults to :data:`DEFAULT_PREDICT_SAMPLES` (100). ``seed``: ``None``
        (fresh random draws), an int or ``[2]`` seed (reproducible draws), or a
        :class:`~deepgp_gi.noise.NoiseSource`; ``noise=`` is its deprecated alias.
        """
        mean, var = self.predict_f_components(
            Xnew, num_samples, seed_or_deprecated_noise(seed, noise, "predict_f")
        )
        return mixture_moments(mean, var, self.posterior.mixture_log_weights())

    @check_shapes("return[0]: [N, P]", "return[1]: [N, P]")
    def predict_y(
        self,
        Xnew,
        num_samples: int = DEFAULT_PREDICT_SAMPLES,
        seed: NoiseLike = None,
        *,
        noise: NoiseLike = None,
    ):
        """Mean and variance ``[N, P]`` of the predictive mixture, likelihood noise included
        (``num_samples`` default 100, ``seed`` as in :meth:`predict_f`)."""
        Xnew = self.check_inputs(Xnew)
        prop = self._propagate(
            Xnew, num_samples, seed_or_deprecated_noise(seed, noise, "predict_y")
        )
        mean, var = self.likelihood_moments(prop)
        ymean, yvar = predict_mean_and_var(self.likelihood, likelihood_rows(Xnew), mean, var)
        return mixture_moments(ymean, yvar, self.posterior.mixture_log_weights())

    @check_shapes("return: [N]")
    def predict_log_density(
        self,
        data,
        num_samples: int = DEFAULT_PREDICT_SAMPLES,
        seed: NoiseLike = None,
        *,
        noise: NoiseLike = None,
    ) -> tf.Tensor:
        """``[N]``: ``logsumexp_s log p(y_n | f_n^(s)) - log S`` (each term exact where possible;
        ``num_samples`` default 100, ``seed`` as in :meth:`predict_f`; a family with weighted
        samples uses its weights)."""
        X, Y = self.check_data(data, names=("Xnew", "Ynew"))
        prop = self._propagate(
            X, num_samples, seed_or_deprecated_noise(seed, noise, "predict_log_density")
        )
        return mixture_log_density(
            self.likelihood,
            likelihood_rows(X),
            *self.likelihood_moments(prop),
            Y,
            self.posterior.mixture_log_weights(),
        )


def likelihood_rows(X: tf.Tensor) -> tf.Tensor:
    """Inputs as the ``[N, D]`` rows GPflow likelihoods expect (images flattened)."""
    if X.shape.rank == 2:
        return X
    return tf.reshape(X, [-1, int(np.prod(X.shape[1:]))])  # static width (GPflow's MC reads it)


def mixture_moments(mean: tf.Tensor, var: tf.Tensor, log_weights=None):
    """Moments of a mixture over the leading axis of ``mean`` and ``var`` ``[S, ...]``: equal
    weights, or ``exp(log_weights)`` (``[S]``, normalised)."""
    first = mixture_mean(mean, log_weights)
    second = mixture_mean(var + tf.square(mean), log_weights)
    return first, tf.maximum(second - tf.square(first), 0.0)
