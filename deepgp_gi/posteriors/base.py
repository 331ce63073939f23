"""The interface every approximate posterior of a deep GP implements.

A posterior owns every variational parameter and knows how to push inputs through the layers:
``posterior.propagate(X, num_samples, seed)`` returns a :class:`Propagation`. ``DeepGP`` builds
its ELBO and predictions from that alone, so a new family is one new subclass.

A family is one class: besides ``propagate`` it says how the builders make it from data
(:meth:`DeepPosterior.from_data`, :meth:`~DeepPosterior.initial_inducing_inputs`,
:meth:`~DeepPosterior.initial_inducing_features`), which keyword options it takes
(:attr:`~DeepPosterior.options`), the default transform of the builders' positive
hyperparameters, its evaluation memory budget, and, if it takes a latent input, its draw of the
inducing outputs (:meth:`~DeepPosterior.inducing_draw`). The name tables of
:mod:`deepgp_gi.posteriors.registry` map names to these classes.
"""

from __future__ import annotations

import abc
from typing import ClassVar, List, NamedTuple, Optional, Sequence, Tuple

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes

from ..layers import check_layer_chain
from ..noise import NoiseLike, NoiseSource, as_noise_source

__all__ = ["Propagation", "DeepPosterior", "float_dtype"]


def float_dtype(module: tf.Module) -> tf.DType:
    """The dtype of ``module``'s first floating-point variable, trainable or not (a frozen model
    keeps its dtype), or GPflow's default float when it has none. Walks the module tree: read it
    once, not per step."""
    for variable in module.variables:
        if variable.dtype.is_floating:
            return variable.dtype
    return tf.as_dtype(gpflow.default_float())


class Propagation(NamedTuple):
    """The result of pushing a batch of inputs through every layer.

    :ivar samples: one ``[S, N, D_l]`` tensor per layer: the sampled function values (the last
        entry is a sample of the last layer, drawn from ``mean``/``var``).
    :ivar mean: ``[S, N, P]`` mean of the last layer's conditional Gaussian per sample.
    :ivar var: ``[S, N, P]`` marginal variance of the last layer's conditional Gaussian. It is
        exactly 0 for the families that sample the last layer's weights explicitly (the BNN
        families other than factorised with the local reparameterisation: local, global,
        factorised_global, random_global): their last layer is a deterministic function of
        the sampled weights, and all randomness sits in the mixture over samples.
    :ivar kl: ``[S]`` the regulariser subtracted in the ELBO for each sample: the analytic KL,
        or the sampled log-ratio ``log q - log p`` summed over layers.
    """

    samples: List[tf.Tensor]
    mean: tf.Tensor
    var: tf.Tensor
    kl: tf.Tensor


class DeepPosterior(gpflow.Module, metaclass=abc.ABCMeta):
    """Base class: an approximate posterior over the functions of a stack of layers.

    The layers are read (kernels, mean functions, widths, local inducing inputs) but not owned:
    they are the model's, and are kept here outside TensorFlow's module tracking so that every
    parameter appears once in ``print_summary(model)``.

    Subclasses implement the abstract :meth:`propagate`, decorated with
    ``check_shapes.inherit_check_shapes`` so that its shape contract is checked, starting with
    ``_start`` (noise source and the inputs broadcast over the sample axis) and ending with
    :meth:`sample_last_layer`.
    """

    # Layers belong to the model; do not track them twice.
    # the model's layers (and a weight-space posterior's weighted subset of them): tracked by
    # the model
    _TF_MODULE_IGNORED_PROPERTIES = gpflow.Module._TF_MODULE_IGNORED_PROPERTIES | frozenset(
        {"_layers", "_weighted"}
    )

    #: The keyword options :meth:`from_data` (and so the builders) accept; anything else is refused
    #: with this list named (:meth:`check_options`).
    options: ClassVar[Tuple[str, ...]] = ()
    #: One line for tables and ``--help``: the family and its paper.
    summary: ClassVar[str] = ""
    #: The default transform of the positive hyperparameters :func:`~deepgp_gi.build_deep_gp`
    #: creates (kernel variances and lengthscales, white noise, the Gaussian likelihood's
    #: variance), following the family's reference code: ``"softplus"`` (GPflow's) or ``"exp"``
    #: (log-parameterised).
    positive_transform: ClassVar[str] = "softplus"
    #: How many (data row, Monte Carlo sample) pairs one evaluation call (``model.elbo``,
    #: ``predict_log_density``, ...) should hold at once; evaluation code slices the rows into
    #: chunks of ``eval_row_samples // num_samples``. Families that keep a large per-point
    #: cross-covariance set it lower.
    eval_row_samples: ClassVar[int] = 100_000
    #: Whether the family propagates inducing rows with the data (global inducing), which
    #: layers such as an inducing batch normalisation need.
    propagates_inducing_rows: ClassVar[bool] = False

    def __init__(self, layers: Sequence, name: Optional[str] = None):
        super().__init__(name=name)
        self.__dict__["_layers"] = tuple(check_layer_chain(layers))

    # ------------------------------------------------------------------ building from data

    @classmethod
    def check_options(cls, options: dict, name: Optional[str] = None) -> None:
        """Refuse keyword ``options`` the family does not take, naming the ones it accepts
        (``name``: the family's name in the messages, default the class name)."""
        unknown = sorted(set(options) - set(cls.options))
        if unknown:
            accepted = ", ".join(cls.options) if cls.options else "none"
            label = repr(name) if name is not None else cls.__name__
            raise ValueError(
                f"posterior {label} does not accept option(s) {', '.join(unknown)}; accepted "
                f"options: {accepted}"
            )

    @classmethod
    def initial_inducing_inputs(
        cls, X: np.ndarray, num_inducing: int, seed: Optional[int]
    ) -> Optional[np.ndarray]:
        """The inducing inputs ``Z`` ``[M, D]`` the builder puts on every GP layer (pushed through
        the inner mean maps), or None when the family keeps no inducing inputs on the layers
        (the default). ``X`` is the ``[N, D]`` training inputs."""
        return None

    @classmethod
    def initial_inducing_features(
        cls, fan_in: int, rng: np.random.Generator
    ) -> Optional[np.ndarray]:
        """The inducing features ``[fan_in, fan_in]`` the BNN builder puts on a DenseLayer (drawn
        from ``rng``), or None when the family keeps none on the layers (the default)."""
        return None

    @classmethod
    def from_data(
        cls,
        layers: Sequence,
        X: np.ndarray,
        Y: np.ndarray,
        *,
        num_inducing: int,
        seed: Optional[int],
        **options,
    ) -> "DeepPosterior":
        """The family's posterior on ``layers``, initialised from the data as its paper does.

        :param layers: the model's layers (with the inducing inputs or features the builder
            placed by :meth:`initial_inducing_inputs` / :meth:`initial_inducing_features`).
        :param X: training inputs ``[N, D]`` (``[N, H, W, C]`` images).
        :param Y: training targets in pseudo-target form ``[N, P]`` (one-hot rows for class
            labels, :func:`~deepgp_gi.initialisation.pseudo_targets`).
        :param num_inducing: M, for the families that place inducing points here.
        :param seed: an int seeding every random initial value (or None).
        :param options: the family's keyword options (:attr:`options`).

        The default builds ``cls(layers, **options)`` (families whose initial values come from
        the layers alone)."""
        return cls(layers, **options)

    # ------------------------------------------------------------------ latent inputs

    @classmethod
    def takes_latent_input(cls) -> bool:
        """Whether a latent-variable model can use this family: it implements
        :meth:`inducing_draw`."""
        return cls.inducing_draw is not DeepPosterior.inducing_draw

    def inducing_draw(self, num_samples: int, source: NoiseSource, dtype: tf.DType):
        """Every layer's inducing outputs drawn from ``q(U)``, ``num_samples`` times, the last
        layer's integrated out where the family can (an
        :class:`~deepgp_gi.posteriors.draws.InducingDraw`): what a latent-variable model
        (:class:`~deepgp_gi.LatentDeepGP`) propagates its grouped rows with. The default
        raises: the family takes no latent input."""
        raise ValueError(
            f"a latent-variable model cannot use {type(self).__name__}: the family does not draw "
            "its inducing outputs as a whole (it implements no inducing_draw)"
        )

    @property
    def layers(self) -> Sequence:
        return self._layers

    @property
    def depth(self) -> int:
        return len(self._layers)

    @property
    def dtype(self) -> tf.DType:
        """The dtype of the posterior's parameters, trainable or frozen (GPflow's default float if
        it has none)."""
        return float_dtype(self)

    @abc.abstractmethod
    @check_shapes(
        "X: [N, D, image_shape...]",
        "return.samples[all]: [S, N, ...]",
        "return.mean: [S, N, P]",
        "return.var: [S, N, P]",
        "return.kl: [S]",
    )
    def propagate(self, X: tf.Tensor, num_samples: int = 1, seed: NoiseLike = None) -> Propagation:
        """Push ``X`` through every layer for ``num_samples`` joint samples.

        :param X: inputs ``[N, D]`` (``[N, H, W, C]`` images for a convolutional network).
        :param num_samples: S, the number of Monte Carlo samples (one sample = one draw of the
            functions of every layer).
        :param seed: ``None`` (fresh random draws), an int or ``[2]`` seed (reproducible draws),
            or a :class:`~deepgp_gi.noise.NoiseSource` (e.g. pre-drawn noise in tests).
        :return: a :class:`Propagation` of the ``N`` data rows: ``samples`` ``[S, N, ...]`` per
            layer (``[S, N, N_l]`` for a dense or GP layer), the last layer's ``mean`` and ``var``
            ``[S, N, P]``, and ``kl`` ``[S]``.
        """

    def mixture_log_weights(self) -> Optional[tf.Tensor]:
        """``[S]``: the log-weights of the propagation's samples in the predictive mixture, or
        ``None`` (the default) when the samples are equally weighted draws. A family whose
        samples are weighted paths (a deep sigma point process) returns them; the model's
        predictions and objectives then use them."""
        return None

    def natural_gradient_blocks(self) -> List[Tuple[gpflow.Parameter, gpflow.Parameter]]:
        """The ``(q_mu [M, P], q_sqrt [P, M, M])`` Gaussian blocks that natural gradients can
        update (``fit(..., natgrad_gamma=...)``). A family without such blocks raises."""
        raise ValueError(
            f"{type(self).__name__} has no Gaussian (mean, square-root covariance) blocks, so "
            "natural gradients do not apply; train it with Adam (natgrad_gamma=None). The "
            "mean-field family has them."
        )

    def _start(
        self, X, num_samples: int, seed: NoiseLike, top_rows=None
    ) -> Tuple[NoiseSource, tf.Tensor]:
        """The prologue of every ``propagate``: the noise source and the rows to push through,
        ``[S, N, D]`` (``[S, M + N, D]`` with ``top_rows`` ``[M, D]`` stacked above the data)."""
        source = as_noise_source(seed)
        X = tf.convert_to_tensor(X)
        if X.dtype != self.dtype:
            X = tf.cast(X, self.dtype)
        if top_rows is not None:
            X = tf.concat([tf.cast(tf.convert_to_tensor(top_rows), X.dtype), X], axis=0)
        return source, tf.broadcast_to(
            tf.expand_dims(X, 0), tf.concat([[num_samples], tf.shape(X)], 0)
        )

    def sample_last_layer(self, mean, var, noise_source: NoiseSource) -> tf.Tensor:
        """Draw the last layer's sample from its conditional marginals (name ``f/{L-1}``, ``L``
        the number of layers the noise names count: :attr:`depth`, or the weighted layers of a
        convolutional network)."""
        eps = noise_source.normal(f"f/{self._num_noise_layers - 1}", tf.shape(mean), mean.dtype)
        return mean + tf.sqrt(tf.maximum(var, 0.0)) * eps

    @property
    def _num_noise_layers(self) -> int:
        """How many layers the noise names ``"f/{l}"``, ``"w/{l}"`` count."""
        return self.depth
