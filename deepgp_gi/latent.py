"""Latent-variable deep GPs and the importance-weighted bound (Salimbeni et al. 2019).

:class:`LatentDeepGP` is a :class:`~deepgp_gi.DeepGP` whose first GP layer sees ``[x, w]``: a
latent vector ``w_n ~ N(0, I)`` ``[D_w]`` per data point, with the amortised
``q(w_n | x_n, y_n)`` of a :class:`~deepgp_gi.layers.latent.LatentVariableLayer`. It trains on the
importance-weighted bound with K draws of ``w`` per data point,

    L_K = sum_n E[ logsumexp_k l_nk - log K ] - KL(q(U) || p(U)),
    l_nk = E_{q(f_L | F_{L-1})}[log p(y_n | f_L)] + log p(w_nk) - log q(w_nk),

where ``F_{L-1}`` are the hidden layers' outputs at the K inputs ``[x_n, w_nk]``. K = 1 is the
ordinary ELBO with ``w``; ``L_K`` does not decrease in expectation as K grows (Burda et al. 2016).

How one draw is made, the same for every family (the "grouped" propagation):

1. ``w_nk = mu_n + sigma_n eps_nk`` (noise ``"f/latent"`` ``[S, B, K, D_w]``);
2. the inducing outputs of every layer are drawn from the family's ``q(U)``, per Monte Carlo
   sample (:func:`inducing_draw`): the family's own Gaussian (mean-field, fully-coupled, STAR) or
   pseudo-data posterior (global and local inducing); the last layer's are integrated out
   (its data rows get the Gaussian marginal given the hidden layers' draws);
3. per hidden layer, the K rows of a data point are drawn *jointly* from the GP conditional given
   the layer's inducing outputs: a ``K x K`` covariance per point and sample
   (``k(F_n, F_n) - A_n^T A_n``, noise ``"f/{l}"`` ``[S, B, K, N_l]``). The K rows are values of one
   function, as the bound requires; drawing them independently would not give a bound.

Sampling ``U`` and then the rows given ``U`` has the distribution of ``q(F)`` with ``U``
integrated out, so every family's bound is its own (the family's KL, the family's ``q(U)``);
only the estimator differs from the family's ``propagate`` (which samples each row from its
marginal). Predictions use the same path with ``K = 1`` and ``w`` drawn from the prior.

The sampling families (``"sghmc"``) are refused: their chain targets ``log p(V) + log p(y | V)``,
and with a latent input that likelihood is an integral over ``w`` with no closed form, so there
is no target for the chain to sample; the importance-weighted bound is an objective for a
variational ``q(U)``.
"""

from __future__ import annotations

import math
from typing import List, NamedTuple, Optional, Sequence, Tuple

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes

from .layers import GPLayer
from .layers.latent import LatentVariableLayer
from .likelihoods import expected_log_likelihood
from .linalg import add_jitter, safe_cholesky
from .models import DeepGP
from .noise import NoiseLike, NoiseSource, as_noise_source
from .posteriors import DeepPosterior, InducingDraw, Propagation
from .posteriors.conditionals import (
    conditional_mean,
    layer_mean,
    residual_variance,
    whitened_projection,
)
from .posteriors.registry import DEEP_GP_FAMILIES
from .validation import check_positive_int

__all__ = [
    "LatentDeepGP",
    "GroupedPropagation",
    "LATENT_FAMILIES",
    "latent_families",
    "InducingDraw",
    "inducing_draw",
    "check_latent_family",
    "with_latent_columns",
]


def latent_families() -> tuple:
    """The deep-GP families a latent-variable model takes (``build_deep_gp(..., latent_dim=...)``):
    those whose class draws its inducing outputs as a whole
    (:meth:`~deepgp_gi.posteriors.DeepPosterior.takes_latent_input`)."""
    return tuple(
        name
        for name, cls in DEEP_GP_FAMILIES.items()
        if cls.takes_latent_input() and not getattr(cls, "is_sampler", False)
    )


#: The built-in deep-GP families a latent-variable model takes (:func:`latent_families` also lists
#: registered ones).
LATENT_FAMILIES = latent_families()

_SAMPLER_REASON = (
    "a sampling family draws its inducing outputs by SGHMC from log p(V) + log p(y | V); with a "
    "latent input w that log-likelihood is an integral over w with no closed form, so the chain "
    "has no target, and the importance-weighted bound is an objective for a variational q(U)"
)


def check_latent_family(name: str, family_class: Optional[type] = None) -> None:
    """Raise a ``ValueError`` saying why if family ``name`` (class ``family_class``, default the
    deep-GP table's) cannot take a latent input."""
    if family_class is None:
        family_class = DEEP_GP_FAMILIES.get(name)
    if family_class is not None and getattr(family_class, "is_sampler", False):
        raise ValueError(
            f"latent_dim does not apply to posterior {name!r}: {_SAMPLER_REASON}; use one of "
            f"{', '.join(map(repr, latent_families()))}"
        )
    if family_class is None or not family_class.takes_latent_input():
        raise ValueError(
            f"latent_dim does not apply to posterior {name!r}; the latent-variable deep GP takes "
            f"{', '.join(map(repr, latent_families()))}"
        )


def with_latent_columns(
    A: np.ndarray, latent_dim: int, rng: Optional[np.random.Generator]
) -> np.ndarray:
    """``[A, W]``: ``latent_dim`` columns appended to the rows of ``A``, ``N(0, 1)`` draws from
    ``rng`` (the prior of ``w``), or zeros when ``rng`` is None."""
    shape = (A.shape[0], latent_dim)
    W = np.zeros(shape) if rng is None else rng.standard_normal(shape)
    return np.concatenate([A, W.astype(A.dtype)], axis=1)


def inducing_draw(
    posterior: DeepPosterior, num_samples: int, source: NoiseSource, dtype
) -> InducingDraw:
    """Every layer's inducing outputs drawn from ``posterior``'s ``q(U)``, S times (the family's
    :meth:`~deepgp_gi.posteriors.DeepPosterior.inducing_draw`); a family without one is refused,
    saying why."""
    if getattr(posterior, "is_sampler", False):
        raise ValueError(
            f"a latent-variable model cannot use {type(posterior).__name__}: {_SAMPLER_REASON}"
        )
    if not type(posterior).takes_latent_input():
        raise ValueError(
            f"a latent-variable model cannot use {type(posterior).__name__}; it takes the families "
            f"{', '.join(map(repr, latent_families()))}"
        )
    return posterior.inducing_draw(num_samples, source, dtype)


# ============================================================================ grouped propagation


class GroupedPropagation(NamedTuple):
    """The rows of B data points with K latent draws each, pushed through every layer.

    :ivar latent: ``[S, B, K, D_w]`` the latent draws.
    :ivar log_ratio: ``[S, B, K]`` ``log p(w) - log q(w)`` (0 for prior draws).
    :ivar samples: per GP layer ``[S, B, K, N_l]`` (the hidden rows drawn jointly over K; the
        last layer's a draw from its marginals).
    :ivar mean: ``[S, B, K, P]`` the last layer's marginal mean per row.
    :ivar var: ``[S, B, K, P]`` its marginal variance.
    :ivar kl: ``[S]`` the family's regulariser.
    """

    latent: tf.Tensor
    log_ratio: tf.Tensor
    samples: List[tf.Tensor]
    mean: tf.Tensor
    var: tf.Tensor
    kl: tf.Tensor


@check_shapes("A: [S, M, BK]", "F: [S, B, K, D]", "return: [S, B, K, K]")
def grouped_covariance(layer: GPLayer, A: tf.Tensor, F: tf.Tensor) -> tf.Tensor:
    """The conditional covariance of the K rows of each point given the inducing outputs,
    ``k(F_n, F_n) - A_n^T A_n`` ``[S, B, K, K]``, its diagonal the residual variance clamped at 0
    (the family's marginal rows: ``k_diag - |A|^2``)."""
    S, B, K = tf.shape(F)[0], tf.shape(F)[1], tf.shape(F)[2]
    M = tf.shape(A)[1]
    A_g = tf.transpose(tf.reshape(A, [S, M, B, K]), [0, 2, 1, 3])  # [S, B, M, K]
    C = layer.K(F) - tf.linalg.matmul(A_g, A_g, transpose_a=True)
    diag = tf.maximum(layer.K_diag(F) - tf.reduce_sum(tf.square(A_g), axis=-2), 0.0)
    return C + tf.linalg.diag(diag - tf.linalg.diag_part(C))


def grouped_propagate(
    posterior: DeepPosterior, H: tf.Tensor, num_samples: int, source: NoiseSource
) -> Tuple[List[tf.Tensor], tf.Tensor, tf.Tensor, tf.Tensor]:
    """Push the first layer's inputs ``H`` ``[S, B, K, D_0]`` (``S = num_samples``) through every
    layer with one draw of ``q(U)`` per sample: ``(samples, mean, var, kl)`` (see
    :class:`GroupedPropagation`)."""
    S, B, K = num_samples, tf.shape(H)[1], tf.shape(H)[2]
    dtype = H.dtype
    jitter = gpflow.config.default_jitter()
    draw = inducing_draw(posterior, S, source, dtype)
    samples = []
    F = H
    for l, layer in enumerate(posterior.layers):
        P = layer.output_dim
        rows = tf.reshape(F, tf.stack([S, B * K, tf.shape(F)[-1]]))
        A = whitened_projection(draw.choleskies[l], layer.K(draw.inputs[l], rows))  # [S, M, BK]
        mean = conditional_mean(
            A, draw.weights[l], layer_mean(layer, rows, draw.residual_mean)
        )  # [S, BK, P]
        mean = tf.reshape(mean, tf.stack([S, B, K, P]))
        if l < posterior.depth - 1:
            L_C = safe_cholesky(
                add_jitter(grouped_covariance(layer, A, F), jitter),
                name=f"joint covariance of the K rows (layer {layer.name})",
            )
            eps = source.normal(f"f/{l}", tf.stack([S, B, K, P]), dtype)
            F = mean + tf.linalg.matmul(L_C, eps)
            samples.append(F)
            continue
        var = residual_variance(layer, rows, A)[..., None] + draw.last_variance(A)
        var = tf.reshape(tf.maximum(var, 0.0), tf.stack([S, B, K, P]))
        eps = source.normal(f"f/{l}", tf.stack([S, B, K, P]), dtype)
        samples.append(mean + tf.sqrt(var) * eps)
    return samples, mean, var, draw.kl


# ============================================================================ the model


class LatentDeepGP(DeepGP):
    """A deep GP with a latent input ``w`` in front of its first GP layer (see the module docs).

    ``elbo``, ``elbo_per_sample`` and :meth:`elbo_terms` take ``importance_samples=K`` (default
    1: the ELBO) and estimate the importance-weighted bound with K draws of ``w`` per point.

    :param layers: the GP layers; ``layers[0].input_dim`` is ``D + D_w``.
    :param likelihood: a GPflow likelihood.
    :param posterior: a posterior of the families in :data:`LATENT_FAMILIES`, built on ``layers``.
    :param latent: the :class:`~deepgp_gi.layers.latent.LatentVariableLayer` (``p(w)``, the
        encoder of ``q(w | x, y)``).
    :param num_data: N, as :class:`~deepgp_gi.DeepGP`.
    :param num_samples: default S for ``training_loss``.
    """

    def __init__(
        self,
        layers: Sequence[GPLayer],
        likelihood: gpflow.likelihoods.Likelihood,
        posterior: DeepPosterior,
        latent: LatentVariableLayer,
        num_data: Optional[int] = None,
        num_samples: int = 1,
        name: Optional[str] = None,
    ):
        super().__init__(
            layers, likelihood, posterior, num_data=num_data, num_samples=num_samples, name=name
        )
        if not isinstance(latent, LatentVariableLayer):
            raise TypeError(f"latent must be a LatentVariableLayer, got {type(latent).__name__}")
        if any(not isinstance(layer, GPLayer) for layer in self.layers):
            raise ValueError("a latent-variable model takes GP layers only")
        if latent.output_dim != self.layers[0].input_dim:
            raise ValueError(
                f"the first layer takes {self.layers[0].input_dim} inputs but the latent layer "
                f"gives {latent.data_dim} + latent_dim {latent.latent_dim} = {latent.output_dim}"
            )
        if getattr(posterior, "is_sampler", False):
            raise ValueError(
                f"a latent-variable model cannot use {type(posterior).__name__}: {_SAMPLER_REASON}"
            )
        self.latent = latent

    @property
    def latent_dim(self) -> int:
        return self.latent.latent_dim

    @property
    def input_dim(self) -> int:
        """``D``: the data's inputs (the first GP layer sees ``D + D_w``)."""
        return self.latent.data_dim

    @property
    def input_shape(self) -> Tuple[int, ...]:
        return (self.input_dim,)

    # ------------------------------------------------------------------ propagation
    def grouped_propagate(
        self,
        X: tf.Tensor,
        num_samples: int,
        importance_samples: int,
        seed: NoiseLike,
        Y: Optional[tf.Tensor] = None,
    ) -> GroupedPropagation:
        """Push ``X`` ``[B, D]`` through the model with K = ``importance_samples`` latent draws per
        point: from ``q(w | x, y)`` when ``Y`` is given, else from the prior ``N(0, I)``.
        ``num_samples`` may be a scalar tensor (a traced function's input, as in a saved model)."""
        S = (
            num_samples
            if tf.is_tensor(num_samples)
            else check_positive_int(num_samples, "num_samples")
        )
        K = check_positive_int(importance_samples, "importance_samples")
        source = as_noise_source(seed)
        X = tf.convert_to_tensor(X)
        B, dtype = tf.shape(X)[0], X.dtype
        eps = source.normal("f/latent", tf.stack([S, B, K, self.latent_dim]), dtype)
        if Y is None:
            w, log_ratio = eps, tf.zeros(tf.stack([S, B, K]), dtype)
        else:
            mu, sigma = self.latent.posterior(X, Y)  # [B, D_w]
            w = mu[None, :, None] + sigma[None, :, None] * eps
            log_ratio = self.latent.log_ratio(w, mu[None, :, None], sigma[None, :, None])
        Xb = tf.broadcast_to(X[None, :, None], tf.stack([S, B, K, tf.shape(X)[-1]]))
        samples, mean, var, kl = grouped_propagate(
            self.posterior, tf.concat([Xb, w], axis=-1), S, source
        )
        return GroupedPropagation(w, log_ratio, samples, mean, var, kl)

    def _propagate(self, X, num_samples, seed) -> Propagation:
        """The predictive propagation behind :meth:`propagate` and every prediction: ``w`` from
        the prior, one per sample and point; ``samples`` is ``[w, F_1, ..., F_L]`` (the latent
        coordinate first, ``[S, N, D_w]``)."""
        X = self.check_inputs(X, "Xnew")
        g = self.grouped_propagate(X, num_samples, 1, seed)
        squeeze = lambda T: T[:, :, 0]  # noqa: E731
        return Propagation(
            samples=[squeeze(g.latent)] + [squeeze(F) for F in g.samples],
            mean=squeeze(g.mean),
            var=squeeze(g.var),
            kl=g.kl,
        )

    # ------------------------------------------------------------------ objective
    # elbo and elbo_per_sample are DeepGP's: they pass importance_samples on to elbo_terms
    @check_shapes("return[0]: [S]", "return[1]: [S]")
    def elbo_terms(
        self,
        data,
        num_samples: int = 1,
        seed: NoiseLike = None,
        *,
        batch_size=None,
        importance_samples: int = 1,
    ) -> Tuple[tf.Tensor, tf.Tensor]:
        """``(ell [S], kl [S])`` of the importance-weighted bound: ``ell`` is
        ``sum_n (logsumexp_k l_nk - log K)`` (rescaled by ``num_data / batch`` when ``num_data`` is
        set; ``batch_size`` as in :meth:`DeepGP.elbo_terms`), with ``l_nk`` the expected
        log-likelihood of draw k plus its ``log p(w) - log q(w)``; ``kl`` the family's
        regulariser."""
        X, Y = self.check_data(data)
        K = check_positive_int(importance_samples, "importance_samples")
        g = self.grouped_propagate(X, num_samples, K, seed, Y=Y)
        S, B = tf.shape(g.mean)[0], tf.shape(X)[0]
        P = g.mean.shape[-1]
        flat = lambda T: tf.reshape(T, tf.stack([S, B * K, P]))  # noqa: E731
        rows = lambda T: tf.repeat(T, K, axis=0)  # noqa: E731  # row n*K + k is point n
        ell = expected_log_likelihood(
            self.likelihood, rows(X), flat(g.mean), flat(g.var), rows(Y)
        )  # [S, B K]
        log_w = tf.reshape(ell, tf.stack([S, B, K])) + g.log_ratio
        bound = tf.reduce_sum(tf.reduce_logsumexp(log_w, axis=-1), axis=-1) - tf.cast(
            B, log_w.dtype
        ) * math.log(K)
        if self.num_data is not None:
            batch = B if batch_size is None else batch_size
            bound = bound * (tf.cast(self.num_data, bound.dtype) / tf.cast(batch, bound.dtype))
        return bound, tf.broadcast_to(g.kl, tf.shape(bound))
