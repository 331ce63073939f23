"""Fit and evaluate one UCI split with the papers' protocol: the routine behind ``deepgp-gi uci``.

A configuration names a model, a posterior, a UCI data set and the training protocol (the keys of
:data:`CONFIG_KEYS`). :func:`normalise_config` fills in defaults (:data:`DEFAULTS`) and resolves
each option to the value it trains with; :func:`config_key` is the canonical string by which two
result records of one configuration are matched.

:func:`run_split` builds the model a configuration names (a deep GP or a BNN), trains it with
:func:`deepgp_gi.fit` on the split's normalised training set, and returns one result record:

* the configuration itself (every key of :data:`CONFIG_KEYS`), the split and the seed used;
* ``elbo_per_datapoint``: the final ELBO divided by N, estimated on the full training set from
  independent Monte Carlo draws until its standard error is below ``elbo_se_target``, or until
  :func:`~deepgp_gi.metrics.estimate_elbo` finds that target out of reach
  (``elbo_se_per_datapoint`` and ``elbo_samples`` say how far that went); NaN for a sampling
  family (``posterior="sghmc"`` or ``"bsgp"``), which has no ELBO: after
  training, :data:`SAMPLER_COLLECT` says how its sample set is collected (recorded as ``collected``,
  timed as ``collect_time_s``);
* ``test_ll`` and ``rmse`` in the original units of the targets, from ``test_samples`` samples of
  the predictive mixture (the papers use S = 100);
* with ``validation`` (a share of the training rows held out, :func:`deepgp_gi.datasets.load_uci`'s
  ``validation``): the model fits the remaining rows, and the record adds ``valid_ll`` and
  ``valid_rmse`` (the same metrics on the held-out rows, seeded by the split's seed) and
  ``n_valid``; ``n_train`` is then the number of rows fitted;
* ``train_time_s`` (the whole training, every process of a resumed run included), ``ms_per_step``
  (training wall time per Adam step after the first logged step, i.e. without
  tracing/compilation) and ``eval_time_s``;
* for the extrapolation protocol, ``test_ll_points`` (each test point's log predictive density,
  original units) and ``test_pit`` (each test target's predictive CDF value), for point-by-point
  comparisons of methods and calibration curves; on the random splits ``test_ll_points`` too where
  the test set has at most :data:`POINTWISE_TEST_ROWS` rows (every set but protein), so that a
  split's test LL can be traced to the points it falls on;
* ``trace``: the training ELBO per datapoint (with ``objective="predictive"``: that objective)
  against step, averaged over blocks of steps (the raw one-sample minibatch estimates are noisy),
  for convergence plots;
* ``noise_variance``: a Gaussian likelihood's learned noise variance in the squared original
  units of the targets (``None`` for another likelihood); at GPflow's floor (1e-6 times
  ``y_std ** 2``) the predictive spread is all the model's own;
* for a deep GP, ``layer_variances``: :func:`~deepgp_gi.metrics.layer_variances` of the trained
  model on the first :data:`LAYER_VARIANCE_ROWS` training rows (``between_rows`` and
  ``within_samples`` per layer, 16 joint samples): a last layer whose output barely varies between
  rows marks a fit that collapsed to the noise (inner layers as noisy as their signal are common in
  mean-field fits that work, docs/metrics.md).

A latent-variable deep GP (``latent_dim``) trains on its importance-weighted bound with
``importance_samples`` draws per point, which ``trace`` and ``final_train_elbo_per_datapoint``
record; ``elbo_per_datapoint`` is its ordinary ELBO (K = 1), comparable with the plain models'.
"""

from __future__ import annotations

import json
import time
from typing import Dict, Optional

import numpy as np

from .metrics import estimate_elbo, smooth_trace

__all__ = [
    "CONFIG_KEYS",
    "DEFAULTS",
    "OBJECTIVE_CHOICES",
    "OFFDIAGONAL_CHOICES",
    "OFFDIAGONAL_DEFAULTS",
    "LAST_LAYER_CHOICES",
    "GLOBAL_LAST_LAYER",
    "SAMPLER_COLLECT",
    "LAYER_VARIANCE_ROWS",
    "POINTWISE_TEST_ROWS",
    "normalise_config",
    "LIKELIHOOD_CHOICES",
    "DEFAULT_STUDENT_T_DF",
    "INITIAL_NOISE_SCALE",
    "likelihood_of",
    "check_learning_rate_decay",
    "learning_rate_of",
    "config_key",
    "build_model",
    "layer_variances_on_training_rows",
    "noise_variance_of",
    "training_device",
    "run_split",
]

#: The keys that identify a configuration (together with the split).
CONFIG_KEYS = (
    "model",
    "dataset",
    "posterior",
    "depth",
    "prior",
    "hidden",
    "num_inducing",
    "steps",
    "batch_size",
    "learning_rate",
    "train_samples",
    "test_samples",
    "seed",
    "positive_transform",
    "protocol",
    "offdiagonal",
    "last_layer",
    "learning_rate_decay",
    "latent_dim",
    "importance_samples",
    "validation",
    "objective",
    "chain_steps",
    "kl_weight",
    "inner_width",
    "likelihood",
    "likelihood_df",
    "collect_step_size",
    "noise_floor",
    "noise_start",
    "kernel_start",
)

#: ``objective``: what a deep GP trains on, :func:`deepgp_gi.fit`'s ``objective``; ``None`` (the
#: default, as in every line written before the key) is the ELBO.
OBJECTIVE_CHOICES = ("elbo", "predictive")

#: ``likelihood``: the observation model of the (standardised) targets; ``None`` (the default, as
#: in every line written before the key) is GPflow's ``Gaussian``, ``"student_t"`` GPflow's
#: ``StudentT`` with ``likelihood_df`` degrees of freedom (fixed) and a learned scale.
LIKELIHOOD_CHOICES = ("gaussian", "student_t")

#: ``likelihood_df``'s value when a Student-t likelihood names none: 4 degrees of freedom, tails
#: heavy enough that one outlying target costs tens of nats less than under a Gaussian, and a
#: finite variance (``df > 2``) for the predictive moments.
DEFAULT_STUDENT_T_DF = 4.0

#: The initial noise scale of the targets (standardised): the Gaussian's standard deviation
#: ``sqrt(0.01)`` (the deep-GP builder's default variance), and the Student-t's scale.
INITIAL_NOISE_SCALE = 0.1

#: ``offdiagonal``: how a STAR or fully-coupled posterior stores its off-diagonal blocks (their
#: ``precondition_offdiagonal``).
OFFDIAGONAL_CHOICES = ("preconditioned", "plain")

#: The deep-GP posteriors that carry ``offdiagonal``, with their defaults (the posteriors' own,
#: preconditioned for both).
OFFDIAGONAL_DEFAULTS = {"stripes_arrow": "preconditioned", "fully_coupled": "preconditioned"}

#: ``last_layer``: whether a global-inducing last layer integrates its inducing outputs (deep GP)
#: or weights (BNN) out of the ELBO (:class:`~deepgp_gi.posteriors.GlobalInducingPosterior`
#: ``last_layer``).
LAST_LAYER_CHOICES = ("marginal", "sampled")

#: The (model, posterior) pairs with a global-inducing last layer, which carry ``last_layer``.
GLOBAL_LAST_LAYER = {
    ("gp", "global"),
    ("bnn", "global"),
    ("bnn", "factorised_global"),
    ("bnn", "random_global"),
}

#: Defaults of the papers' protocol (DSVI / O&A deep GPs): M = 100, Adam 0.01, full batch up
#: to 10,000.
DEFAULTS = dict(
    model="gp",
    posterior="mean_field",
    depth=2,
    prior=None,
    hidden=None,
    num_inducing=100,
    steps=20000,
    batch_size=None,
    learning_rate=0.01,
    train_samples=1,
    test_samples=100,
    seed=0,
    positive_transform=None,
    protocol="random",
    offdiagonal=None,
    last_layer=None,
    learning_rate_decay=None,
    latent_dim=None,
    importance_samples=None,
    validation=None,
    objective=None,
    chain_steps=None,
    kl_weight=None,
    inner_width=None,
    likelihood=None,
    likelihood_df=None,
    collect_step_size=None,
    noise_floor=None,
    noise_start=None,
    kernel_start=None,
)


def normalise_config(cfg: Dict) -> Dict:
    """Fill defaults and put the configuration in the canonical form stored in result lines.

    ``model`` is ``"gp"`` (deep GP; ``"dgp"`` is accepted) or ``"bnn"``; for a BNN ``depth`` is the
    number of weight layers (``len(hidden) + 1``) and ``prior`` defaults to ``"neal"``; a deep GP
    has ``prior = hidden = None``. ``positive_transform`` (deep GPs only; ``None`` for a BNN) is
    resolved to the family's default (its posterior class's ``positive_transform``) when
    not given, so a line records the transform it was trained with. ``protocol`` is the split
    protocol of :func:`deepgp_gi.datasets.load_uci` (``"random"``, ``"extrapolation"`` or
    ``"random_80_20"``).
    ``offdiagonal`` (STAR and fully-coupled, else ``None``) is ``"preconditioned"`` or ``"plain"``
    (defaults: :data:`OFFDIAGONAL_DEFAULTS`): their ``precondition_offdiagonal`` option.
    ``last_layer`` (posteriors with a global-inducing last layer, :data:`GLOBAL_LAST_LAYER`, else
    ``None``) is ``"marginal"`` (the default) or ``"sampled"``: their ``last_layer`` option.
    ``learning_rate_decay`` is ``None`` (a constant learning rate) or ``[rate, every]``: the
    learning rate is multiplied by ``rate`` every ``every`` steps (a staircase, as Lindinger et
    al.'s 0.98 every 1,000 steps; see :func:`learning_rate_of`). ``latent_dim`` (deep GPs only) is
    ``None`` (a plain deep GP) or ``D_w >= 1``: a latent-variable deep GP
    (``build_deep_gp(..., latent_dim=D_w)``), trained on the importance-weighted bound with
    ``importance_samples`` (K, default 1) draws per point; a plain model has
    ``importance_samples = None``. Lines written before these keys read as plain models (both
    ``None``). ``validation`` is ``None`` (train on the whole training split) or the share of the
    training rows held out for validation, a float in (0, 1) (``True`` means
    :data:`~deepgp_gi.datasets.uci.VALIDATION_FRACTION`, 0.1; ``False`` means ``None``); lines
    written before the key read as ``None``. ``objective`` is ``None`` (train on the ELBO;
    ``"elbo"`` is stored as ``None``) or ``"predictive"`` (``fit(..., objective="predictive")``, the
    predictive objective of Jankowiak et al. 2020, for the variational deep-GP families: not a BNN,
    a sampling family or a latent-variable model); lines written before the key read as ``None``.
    ``chain_steps`` (sampling families only, else ``None``) is ``None`` (one chain step per
    hyperparameter step, the families' default; ``1`` is stored as ``None``) or an integer ``> 1``:
    their ``chain_steps`` option (21: Rossi et al.'s schedule; ``steps`` then counts chain steps).
    ``kl_weight`` (variational deep GPs only) is ``None`` (1, stored as ``None``) or a constant
    weight in ``(0, 1)`` on the KL term of the objective (``fit(kl_schedule=ConstantSchedule(w))``).
    ``inner_width`` (deep GPs only) is ``None`` (the builder's default, ``min(30, D)``) or the width
    of the inner layers (``build_deep_gp(inner_width=...)``). Lines written before these three keys
    read as ``None``. ``likelihood`` is ``None`` (Gaussian; ``"gaussian"`` is stored as ``None``)
    or ``"student_t"`` (:data:`LIKELIHOOD_CHOICES`), whose ``likelihood_df`` (degrees of freedom,
    a finite number above 2; default :data:`DEFAULT_STUDENT_T_DF`) is stored with it; a Gaussian
    has ``likelihood_df = None``. Lines written before these two keys read as Gaussian.
    ``collect_step_size`` (sampling families only, else ``None``) is ``None`` (the sample set is
    collected at the posterior's own ``step_size``, the training step) or a positive float: the
    chain's step while :func:`run_split` collects the sample set
    (``collect_samples(..., step_size=...)``; a larger step mixes faster in weakly determined
    directions, ``docs/sampling.md``); lines written before the key read as ``None``.
    ``noise_floor`` (Gaussian likelihood only, else ``None``) is ``None`` (GPflow's lower bound on
    the noise variance, 1e-6 on the standardised targets) or a positive float: the lowest noise
    variance the likelihood may learn, in the squared original units of the targets (1/12 is the
    variance of rounding to integers, the floor for integer-graded targets such as wine's quality);
    :func:`build_model` divides it by ``y_std ** 2``. Lines written before the key read as ``None``.
    ``noise_start`` is ``None`` (the builders' start: a Gaussian variance of 0.01 for a deep GP,
    ``exp(-3)`` for a BNN, a Student-t scale of :data:`INITIAL_NOISE_SCALE`) or a positive float:
    the noise variance the likelihood starts from (a Student-t's squared scale), on the
    standardised targets, so ``1.0`` is the training targets' variance (the SGHMC reference code's
    start, ``docs/sampling.md``). With ``noise_floor`` it must lie above the floor (checked by
    :func:`likelihood_of`, which knows ``y_std``). Lines written before the key read as ``None``.
    ``kernel_start`` (deep GPs only, else ``None``) is ``None`` (the builders' start, the DSVI
    paper's; ``"dsvi"`` is stored as ``None``) or ``"havasi"``: where the kernels' variances and
    lengthscales start (``build_deep_gp(kernel_start=...)``,
    :data:`~deepgp_gi.builders.KERNEL_STARTS`). Lines written before the key read as ``None``.
    """
    from .builders import POSITIVE_TRANSFORMS
    from .datasets import PROTOCOLS
    from .families import DEEP_GP_FAMILIES
    from .validation import check_choice

    out = dict(DEFAULTS)
    out.update({k: v for k, v in cfg.items() if k in CONFIG_KEYS})
    if "dataset" not in cfg:
        raise ValueError("a configuration needs a dataset")
    model = {"dgp": "gp"}.get(out["model"], out["model"])
    if model not in ("gp", "bnn"):
        raise ValueError(f"model must be 'gp' (or 'dgp') or 'bnn', got {out['model']!r}")
    out["model"] = model
    if model == "bnn":
        out["hidden"] = [int(h) for h in (out["hidden"] if out["hidden"] is not None else (50, 50))]
        out["depth"] = len(out["hidden"]) + 1
        out["prior"] = out["prior"] or "neal"
        if "posterior" not in cfg:
            out["posterior"] = "global"
        out["positive_transform"] = None
    else:
        out["prior"] = None
        out["hidden"] = None
        out["depth"] = int(out["depth"])
        family = DEEP_GP_FAMILIES.get(out["posterior"])
        if out["positive_transform"] is None and family is not None:
            out["positive_transform"] = family.positive_transform
        if out["positive_transform"] is not None:
            out["positive_transform"] = check_choice(
                out["positive_transform"], "positive_transform", POSITIVE_TRANSFORMS
            )
    out["protocol"] = check_choice(out["protocol"], "protocol", PROTOCOLS)
    if model == "gp" and out["posterior"] in OFFDIAGONAL_DEFAULTS:
        out["offdiagonal"] = check_choice(
            out["offdiagonal"] or OFFDIAGONAL_DEFAULTS[out["posterior"]],
            "offdiagonal",
            OFFDIAGONAL_CHOICES,
        )
    elif out["offdiagonal"] is not None:
        raise ValueError(
            f"offdiagonal applies to the {' and '.join(OFFDIAGONAL_DEFAULTS)} posteriors only, got "
            f"{out['offdiagonal']!r} for posterior {out['posterior']!r}"
        )
    if (model, out["posterior"]) in GLOBAL_LAST_LAYER:
        out["last_layer"] = check_choice(
            out["last_layer"] or "marginal", "last_layer", LAST_LAYER_CHOICES
        )
    elif out["last_layer"] is not None:
        raise ValueError(
            f"last_layer applies to a global-inducing last layer only, got {out['last_layer']!r} "
            f"for model {model!r}, posterior {out['posterior']!r}"
        )
    for k in ("num_inducing", "steps", "train_samples", "test_samples", "seed"):
        out[k] = int(out[k])
    out["learning_rate"] = float(out["learning_rate"])
    if out["learning_rate_decay"] is not None:
        out["learning_rate_decay"] = check_learning_rate_decay(out["learning_rate_decay"])
    if out["batch_size"] is not None:
        out["batch_size"] = int(out["batch_size"])
    _normalise_latent(out)
    if out["validation"] is False:
        out["validation"] = None
    if out["validation"] is not None:
        from .datasets.uci import check_validation_fraction

        out["validation"] = check_validation_fraction(out["validation"])
    _normalise_objective(out)
    _normalise_family_options(out)
    _normalise_likelihood(out)
    return out


def _normalise_likelihood(out: Dict) -> None:
    """``likelihood``, ``likelihood_df``, ``noise_floor`` and ``noise_start`` in place (see
    :func:`normalise_config`)."""
    from .validation import check_choice, check_float_above, check_positive_float

    if out["noise_start"] is not None:
        out["noise_start"] = check_positive_float(out["noise_start"], "noise_start")
    name = out["likelihood"]
    name = "gaussian" if name is None else check_choice(name, "likelihood", LIKELIHOOD_CHOICES)
    if name == "gaussian":
        if out["likelihood_df"] is not None:
            raise ValueError(
                f"likelihood_df applies to likelihood 'student_t' only, got "
                f"{out['likelihood_df']!r} for a Gaussian likelihood"
            )
        out["likelihood"] = None
        if out["noise_floor"] is not None:
            out["noise_floor"] = check_positive_float(out["noise_floor"], "noise_floor")
        return
    if out["noise_floor"] is not None:
        raise ValueError(
            f"noise_floor applies to the Gaussian likelihood only, got {out['noise_floor']!r} "
            f"for likelihood {name!r}"
        )
    df = DEFAULT_STUDENT_T_DF if out["likelihood_df"] is None else out["likelihood_df"]
    df = check_float_above(df, "likelihood_df", 2.0, "the Student-t's variance is then finite")
    out["likelihood"], out["likelihood_df"] = name, df


def likelihood_of(cfg: Dict, y_std: float = 1.0):
    """The GPflow likelihood a normalised configuration trains on targets standardised by
    ``y_std``: ``None`` for the builders' default Gaussian (variance 0.01 for a deep GP,
    ``exp(-3)`` for a BNN); with ``noise_floor``, a Gaussian whose variance is bounded below by
    ``noise_floor / y_std ** 2`` and starts that default above it; or a
    :class:`~deepgp_gi.likelihoods.StudentT` with ``cfg["likelihood_df"]`` degrees of freedom and
    scale :data:`INITIAL_NOISE_SCALE`. ``noise_start``, when given, replaces the start (the
    Gaussian's variance, the Student-t's squared scale); below a floor it is refused. Positive
    parameters are stored with the configuration's ``positive_transform`` (GPflow's default for a
    BNN)."""
    from .builders import positive_transform_context

    start = cfg.get("noise_start")
    if cfg.get("likelihood") is None:
        if cfg.get("noise_floor") is None and start is None:
            return None
        import gpflow

        from .bnn import DEFAULT_BNN_NOISE_VARIANCE

        bound = {}  # GPflow's own lower bound unless there is a floor
        if cfg.get("noise_floor") is not None:
            bound["variance_lower_bound"] = floor = cfg["noise_floor"] / float(y_std) ** 2
            if start is None:  # the builders' default start, above the floor
                start = floor + (DEFAULT_BNN_NOISE_VARIANCE if cfg.get("model") == "bnn" else 0.01)
            elif not start > floor:
                raise ValueError(
                    f"noise_start must lie above the noise floor on the standardised targets "
                    f"(noise_floor / y_std**2 = {floor:.4g}), got {start!r}"
                )
        with positive_transform_context(cfg.get("positive_transform")):
            return gpflow.likelihoods.Gaussian(variance=start, **bound)
    from .likelihoods import StudentT

    scale = INITIAL_NOISE_SCALE if start is None else float(np.sqrt(start))
    with positive_transform_context(cfg.get("positive_transform")):
        return StudentT(scale=scale, df=cfg["likelihood_df"])


def _normalise_family_options(out: Dict) -> None:
    """``chain_steps``, ``collect_step_size``, ``kl_weight``, ``inner_width`` and ``kernel_start``
    in place (see
    :func:`normalise_config`): each checked, refused for a model it does not apply to, and ``None``
    at its default."""
    from .builders import KERNEL_STARTS
    from .families import DEEP_GP_FAMILIES
    from .training.tempering import ConstantSchedule
    from .validation import check_choice, check_positive_float, check_positive_int

    family = DEEP_GP_FAMILIES.get(out["posterior"]) if out["model"] == "gp" else None
    sampler = bool(getattr(family, "is_sampler", False))

    def refuse(key: str, applies_to: str) -> None:
        raise ValueError(
            f"{key} applies to {applies_to} only, got {out[key]!r} for model {out['model']!r}, "
            f"posterior {out['posterior']!r}"
        )

    if out["inner_width"] is not None:
        if out["model"] != "gp":
            refuse("inner_width", "deep GPs")
        out["inner_width"] = check_positive_int(out["inner_width"], "inner_width")
    if out["kernel_start"] is not None:
        kernel_start = check_choice(out["kernel_start"], "kernel_start", KERNEL_STARTS)
        if out["model"] != "gp":
            refuse("kernel_start", "deep GPs")
        out["kernel_start"] = None if kernel_start == "dsvi" else kernel_start
    if out["chain_steps"] is not None:
        chain_steps = check_positive_int(out["chain_steps"], "chain_steps")
        if not sampler:
            refuse("chain_steps", "the sampling families (sghmc, bsgp)")
        out["chain_steps"] = None if chain_steps == 1 else chain_steps
    if out["collect_step_size"] is not None:
        step_size = check_positive_float(out["collect_step_size"], "collect_step_size")
        if not sampler:
            refuse("collect_step_size", "the sampling families (sghmc, bsgp)")
        out["collect_step_size"] = step_size
    if out["kl_weight"] is not None:
        weight = ConstantSchedule(out["kl_weight"]).weight
        if family is None or sampler or weight == 0.0:
            refuse("kl_weight", "the variational deep-GP families, with a weight in (0, 1],")
        out["kl_weight"] = None if weight == 1.0 else weight


def _normalise_objective(out: Dict) -> None:
    """``objective`` in place (see :func:`normalise_config`)."""
    from .families import DEEP_GP_FAMILIES
    from .validation import check_choice

    if out["objective"] is None:
        return
    objective = check_choice(out["objective"], "objective", OBJECTIVE_CHOICES)
    if objective == "elbo":
        out["objective"] = None
        return
    family = DEEP_GP_FAMILIES.get(out["posterior"]) if out["model"] == "gp" else None
    if family is None or getattr(family, "is_sampler", False) or out["latent_dim"] is not None:
        raise ValueError(
            f"objective={objective!r} applies to the variational deep-GP families without a latent "
            f"input only, got model {out['model']!r}, posterior {out['posterior']!r}, "
            f"latent_dim {out['latent_dim']!r}"
        )
    out["objective"] = objective


def _normalise_latent(out: Dict) -> None:
    """``latent_dim`` and ``importance_samples`` in place (see :func:`normalise_config`)."""
    from .validation import check_positive_int

    if out["latent_dim"] is None:
        if out["importance_samples"] is not None:
            raise ValueError(
                f"importance_samples={out['importance_samples']!r} needs a latent-variable deep "
                "GP: set latent_dim too"
            )
        return
    if out["model"] != "gp":
        raise ValueError(
            f"latent_dim applies to deep GPs (model 'gp') only, got model {out['model']!r}"
        )
    out["latent_dim"] = check_positive_int(out["latent_dim"], "latent_dim")
    K = 1 if out["importance_samples"] is None else out["importance_samples"]
    out["importance_samples"] = check_positive_int(K, "importance_samples")


def check_learning_rate_decay(decay) -> list:
    """``[rate, every]`` with ``rate`` in (0, 1] and ``every`` a positive integer number of steps,
    as floats and ints; anything else is a ``ValueError`` naming ``learning_rate_decay``."""
    if not (isinstance(decay, (list, tuple)) and len(decay) == 2):
        raise ValueError(f"learning_rate_decay must be [rate, every], got {decay!r}")
    rate, every = float(decay[0]), int(decay[1])
    if not (0.0 < rate <= 1.0) or every < 1 or every != decay[1]:
        raise ValueError(
            "learning_rate_decay must be [rate in (0, 1], every >= 1 steps (an integer)], got "
            f"{decay!r}"
        )
    return [rate, every]


def learning_rate_of(cfg: Dict):
    """The ``learning_rate`` argument of :func:`~deepgp_gi.fit` for a normalised configuration: the
    float ``learning_rate``, or with ``learning_rate_decay = [rate, every]`` a staircase
    ``ExponentialDecay`` (``learning_rate * rate ** floor(step / every)``)."""
    if cfg.get("learning_rate_decay") is None:
        return cfg["learning_rate"]
    import gpflow

    rate, every = cfg["learning_rate_decay"]
    return gpflow.keras.tf_keras.optimizers.schedules.ExponentialDecay(
        cfg["learning_rate"], decay_steps=every, decay_rate=rate, staircase=True
    )


def config_key(cfg: Dict) -> str:
    """A canonical string of the configuration (the keys of :data:`CONFIG_KEYS`; a missing key reads
    as ``None``), for matching the records of one configuration."""
    return json.dumps({k: cfg.get(k) for k in CONFIG_KEYS}, sort_keys=True)


#: How :func:`run_split` collects a sampling family's sample set after training (``collect_samples``
#: arguments; Havasi et al. 2018's reference settings). ``train_time_s`` includes the collection.
SAMPLER_COLLECT = {"num_samples": 100, "thin": 50}

#: Training rows (at most) on which :func:`run_split` records a deep GP's ``layer_variances``.
LAYER_VARIANCE_ROWS = 2000

#: Test rows (at most) for which :func:`run_split` records each point's log predictive density on
#: the random splits (``test_ll_points``).
POINTWISE_TEST_ROWS = 2000


def build_model(cfg: Dict, split: int):
    """The untrained model configuration ``cfg`` names on UCI split ``split``, as :func:`run_split`
    builds it (same seed), and the split's data: ``(model, data)``. Restoring a run's checkpoint
    into this model gives the trained one."""
    from . import datasets
    from .builders import build_deep_gp

    cfg = normalise_config(cfg)
    data = datasets.load_uci(
        cfg["dataset"], split, protocol=cfg["protocol"], validation=cfg["validation"]
    )
    N = data.X_train.shape[0]
    seed = cfg["seed"] + split
    if cfg["model"] == "gp":
        M = min(cfg["num_inducing"], N) if cfg["posterior"] != "global" else cfg["num_inducing"]
        options = {}
        if cfg["posterior"] in OFFDIAGONAL_DEFAULTS:
            options["precondition_offdiagonal"] = cfg["offdiagonal"] == "preconditioned"
        if cfg["posterior"] == "global":
            options["last_layer"] = cfg["last_layer"]
        if cfg["chain_steps"] is not None:
            options["chain_steps"] = cfg["chain_steps"]
        if cfg["inner_width"] is not None:
            options["inner_width"] = cfg["inner_width"]
        if cfg["kernel_start"] is not None:
            options["kernel_start"] = cfg["kernel_start"]
        if (
            cfg["latent_dim"] is not None
        ):  # a latent-variable deep GP, trained on the K-sample bound
            options["latent_dim"] = cfg["latent_dim"]
        model = build_deep_gp(
            data.X_train,
            data.Y_train,
            depth=cfg["depth"],
            posterior=cfg["posterior"],
            num_inducing=M,
            seed=seed,
            positive_transform=cfg["positive_transform"],
            likelihood=likelihood_of(cfg, data.y_std),
            **options,
        )
    else:
        from .bnn import build_bnn

        options = {"last_layer": cfg["last_layer"]} if cfg["last_layer"] is not None else {}
        model = build_bnn(
            data.X_train,
            data.Y_train,
            hidden=tuple(cfg["hidden"]),
            posterior=cfg["posterior"],
            prior=cfg["prior"],
            num_inducing=cfg["num_inducing"],
            seed=seed,
            likelihood=likelihood_of(cfg, data.y_std),
            **options,
        )
    return model, data


def noise_variance_of(model, y_std: float) -> Optional[float]:
    """The Gaussian likelihood's learned noise variance in the squared original units of the
    targets (the model's, on standardised targets, times ``y_std ** 2``); ``None`` for another
    likelihood."""
    import gpflow

    if not isinstance(model.likelihood, gpflow.likelihoods.Gaussian):
        return None
    return float(model.likelihood.variance.numpy()) * float(y_std) ** 2


def layer_variances_on_training_rows(model, data, cfg: Dict, split: int):
    """:func:`~deepgp_gi.metrics.layer_variances` of the deep GP that ``cfg`` names (trained or
    not) on the first :data:`LAYER_VARIANCE_ROWS` training rows of ``data`` (fewer when the
    family's evaluation budget is smaller), 16 joint samples, seeded by the split's seed:
    ``(rows, LayerVariances)``."""
    from . import metrics
    from .families import DEEP_GP_FAMILIES

    cfg = normalise_config(cfg)
    layer_samples = 16
    budget = DEEP_GP_FAMILIES[cfg["posterior"]].eval_row_samples // layer_samples
    rows = max(2, min(int(data.X_train.shape[0]), LAYER_VARIANCE_ROWS, budget))
    return rows, metrics.layer_variances(
        model, data.X_train[:rows], layer_samples, seed=cfg["seed"] + split
    )


def training_device() -> str:
    """Where this process trains: ``"GPU: <name>"`` when TensorFlow sees a GPU (it places the step
    there), else ``"CPU"``. A record's ``ms_per_step`` only compares with records of the same
    device."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "CPU"
    name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", gpus[0].name)
    return f"GPU: {name}"


def run_split(
    cfg: Dict,
    split: int,
    *,
    progress: bool = False,
    checkpoint_dir: Optional[str] = None,
    elbo_se_target: float = 0.01,
    trace_points: int = 200,
) -> Dict:
    """Fit configuration ``cfg`` (see :func:`normalise_config`) on UCI split ``split``; return the
    record."""
    from . import metrics
    from .families import BNN_FAMILIES, DEEP_GP_FAMILIES
    from .training import ConstantSchedule, fit

    cfg = normalise_config(cfg)
    model, data = build_model(cfg, split)
    N = data.X_train.shape[0]
    batch_size = min(cfg["batch_size"] or 10000, N)
    seed = cfg["seed"] + split
    t0 = time.perf_counter()
    history = fit(
        model,
        (data.X_train, data.Y_train),
        steps=cfg["steps"],
        batch_size=batch_size,
        learning_rate=learning_rate_of(cfg),
        num_samples=cfg["train_samples"],
        seed=seed,
        progress=progress,
        checkpoint_dir=checkpoint_dir,
        importance_samples=cfg["importance_samples"],
        **({"objective": cfg["objective"]} if cfg["objective"] else {}),
        **({"kl_schedule": ConstantSchedule(cfg["kl_weight"])} if cfg["kl_weight"] else {}),
    )
    sampler = bool(getattr(model.posterior, "is_sampler", False))
    collect_time = 0.0
    if (
        sampler
    ):  # the sample set the predictions mix over (Havasi et al.'s 100 samples, 50 steps apart)
        from .training import collect_samples

        t_collect = time.perf_counter()
        collect_samples(
            model,
            (data.X_train, data.Y_train),
            num_samples=SAMPLER_COLLECT["num_samples"],
            thin=SAMPLER_COLLECT["thin"],
            seed=seed,
            batch_size=batch_size,
            progress=progress,
            step_size=cfg["collect_step_size"],
        )
        collect_time = time.perf_counter() - t_collect
    # a run resumed from a checkpoint: its history's clock covers the earlier processes too, this
    # process's clock only the rest
    train_time = max(
        time.perf_counter() - t0,
        (history.wall_time[-1] if history.wall_time else 0.0) + collect_time,
    )
    w, s = history.wall_time, history.step
    ms_per_step = (
        1000.0 * (w[-1] - w[0]) / (s[-1] - s[0]) if len(s) > 1 and s[-1] > s[0] else float("nan")
    )

    t1 = time.perf_counter()
    # evaluation memory: the family's (row, sample) budget per call, in row chunks
    row_samples = (DEEP_GP_FAMILIES if cfg["model"] == "gp" else BNN_FAMILIES)[
        cfg["posterior"]
    ].eval_row_samples
    samples_per_draw = 8
    if sampler:  # a sampling family has no ELBO: its history holds the log joint of the chain
        elbo, elbo_se, elbo_samples = float("nan"), float("nan"), 0
    else:
        elbo, elbo_se, elbo_samples = estimate_elbo(
            model,
            (data.X_train, data.Y_train),
            se_target=elbo_se_target,
            seed=seed,
            samples_per_draw=samples_per_draw,
            chunk_size=max(1, row_samples // samples_per_draw),
        )
    S = cfg["test_samples"]
    chunk = max(1, min(1000, row_samples // S))
    pointwise = cfg["protocol"] != "random"
    lpd = None
    if pointwise:  # per-point results, for comparing methods point by point and calibration curves
        lpd = metrics.pointwise_log_density(
            model, data.X_test, data.Y_test, data.y_std, S, chunk, seed=seed
        )
        pit = metrics.predictive_cdf(model, data.X_test, data.Y_test, S, chunk, seed=seed)
        test_ll = float(np.mean(lpd))
    else:
        test_ll = metrics.test_log_likelihood(model, data.X_test, data.Y_test, data.y_std, S, chunk)
        if data.X_test.shape[0] <= POINTWISE_TEST_ROWS:  # where a split's test LL falls
            lpd = metrics.pointwise_log_density(
                model, data.X_test, data.Y_test, data.y_std, S, chunk, seed=seed
            )
    err = metrics.rmse(model, data.X_test, data.Y_test, data.y_std, S, chunk)
    valid = {}
    if (
        cfg["validation"] is not None
    ):  # the held-out training rows, for choosing among configurations
        valid = dict(
            valid_ll=float(
                metrics.test_log_likelihood(
                    model, data.X_valid, data.Y_valid, data.y_std, S, chunk, seed=seed
                )
            ),
            valid_rmse=float(
                metrics.rmse(model, data.X_valid, data.Y_valid, data.y_std, S, chunk, seed=seed)
            ),
            n_valid=int(data.X_valid.shape[0]),
        )
    spread = None
    if cfg["model"] == "gp":
        rows, spread = layer_variances_on_training_rows(model, data, cfg, split)
    eval_time = time.perf_counter() - t1
    trace_steps, trace_elbo = smooth_trace(history.step, history.elbo_per_datapoint, trace_points)

    record = dict(cfg)
    record.update(
        split=split,
        seed_used=seed,
        n_train=int(N),
        n_test=int(data.X_test.shape[0]),
        batch_size_used=batch_size,
        test_ll=float(test_ll),
        rmse=float(err),
        **valid,
        elbo_per_datapoint=elbo,
        elbo_se_per_datapoint=elbo_se,
        elbo_samples=elbo_samples,
        final_train_elbo_per_datapoint=float(history.elbo_per_datapoint[-1]),
        train_time_s=round(train_time, 2),
        ms_per_step=round(ms_per_step, 3),
        eval_time_s=round(eval_time, 2),
        resumed_from=int(history.resumed_from),
        device=training_device(),
        noise_variance=(
            None if (v := noise_variance_of(model, data.y_std)) is None else float(f"{v:.4g}")
        ),
        **(
            {"collected": dict(SAMPLER_COLLECT), "collect_time_s": round(collect_time, 2)}
            if sampler
            else {}
        ),
        trace={"step": trace_steps, "elbo_per_datapoint": [round(v, 5) for v in trace_elbo]},
    )
    if spread is not None:
        record["layer_variances"] = {
            "rows": rows,
            "between_rows": [float(f"{v:.4g}") for v in spread.between_rows],
            "within_samples": [float(f"{v:.4g}") for v in spread.within_samples],
        }
    if lpd is not None:
        record["test_ll_points"] = [round(float(v), 5) for v in lpd]
    if pointwise:
        record["test_pit"] = [round(float(v), 5) for v in pit]
    return record
