"""The configuration of a benchmark run and the canonical form stored in its result lines.

A configuration names a model, a posterior, a UCI data set and the training protocol (the keys of
:data:`CONFIG_KEYS`). :func:`normalise_config` fills in defaults (:data:`DEFAULTS`) and resolves
each option to the value it trains with; :func:`config_key` is the canonical string two lines are
matched by. Keys added after result lines were written read as :data:`LEGACY_VALUES` in those
lines (:func:`with_legacy_values`), so old lines keep matching the configuration they ran.
:func:`deepgp_gi.experiments.run_split` runs one configuration on one split.
"""
from __future__ import annotations

import json
from typing import Dict

__all__ = ["CONFIG_KEYS", "DEFAULTS", "LEGACY_VALUES", "OFFDIAGONAL_CHOICES", "OFFDIAGONAL_DEFAULTS",
           "LAST_LAYER_CHOICES", "GLOBAL_LAST_LAYER", "normalise_config", "check_learning_rate_decay", "learning_rate_of", "with_legacy_values", "config_key"]

#: The keys that identify a configuration (together with the split).
CONFIG_KEYS = ("model", "dataset", "posterior", "depth", "prior", "hidden", "num_inducing", "steps", "batch_size",
               "learning_rate", "train_samples", "test_samples", "seed", "positive_transform", "protocol",
               "offdiagonal", "last_layer", "learning_rate_decay", "latent_dim", "importance_samples")

#: Values of keys added to :data:`CONFIG_KEYS` later, for result lines written before them: every
#: earlier line used the random 90/10 splits, every earlier deep GP the softplus transform (the
#: library's only one then), every earlier STAR posterior the plain off-diagonal blocks, and every
#: earlier global-inducing last layer (deep GP or BNN) was sampled.
#: :func:`config_key` reads a missing key as this value.
LEGACY_VALUES = {"protocol": "random", "positive_transform": "softplus", "offdiagonal": "plain",
                 "last_layer": "sampled"}

#: ``offdiagonal``: how a STAR or fully-coupled posterior stores its off-diagonal blocks (their
#: ``precondition_offdiagonal``).
OFFDIAGONAL_CHOICES = ("preconditioned", "plain")

#: The deep-GP posteriors that carry ``offdiagonal``, with their defaults (the posteriors' own,
#: preconditioned for both; fully-coupled lines written before that default, and before the key,
#: were trained with Lindinger's plain storage and say so, or read so through
#: :data:`LEGACY_VALUES`).
OFFDIAGONAL_DEFAULTS = {"stripes_arrow": "preconditioned", "fully_coupled": "preconditioned"}

#: ``last_layer``: whether a global-inducing last layer integrates its inducing outputs (deep GP)
#: or weights (BNN) out of the ELBO (:class:`~deepgp_gi.posteriors.GlobalInducingPosterior`
#: ``last_layer``).
LAST_LAYER_CHOICES = ("marginal", "sampled")

#: The (model, posterior) pairs with a global-inducing last layer, which carry ``last_layer``.
GLOBAL_LAST_LAYER = {("gp", "global"), ("bnn", "global"), ("bnn", "factorised_global"), ("bnn", "random_global")}

#: Defaults of the papers' protocol (DSVI / O&A deep GPs): M = 100, Adam 0.01, full batch up to 10,000.
DEFAULTS = dict(model="gp", posterior="mean_field", depth=2, prior=None, hidden=None, num_inducing=100,
                steps=20000, batch_size=None, learning_rate=0.01, train_samples=1, test_samples=100, seed=0,
                positive_transform=None, protocol="random", offdiagonal=None, last_layer=None,
                learning_rate_decay=None, latent_dim=None, importance_samples=None)


def normalise_config(cfg: Dict) -> Dict:
    """Fill defaults and put the configuration in the canonical form stored in result lines.

    ``model`` is ``"gp"`` (deep GP; ``"dgp"`` is accepted) or ``"bnn"``; for a BNN ``depth`` is the
    number of weight layers (``len(hidden) + 1``) and ``prior`` defaults to ``"neal"``; a deep GP
    has ``prior = hidden = None``. ``positive_transform`` (deep GPs only; ``None`` for a BNN) is
    resolved to the family's default (:attr:`deepgp_gi.families.Family.positive_transform`) when
    not given, so a line records the transform it was trained with. ``protocol`` is the split
    protocol of :func:`deepgp_gi.datasets.load_uci` (``"random"`` or ``"extrapolation"``).
    ``offdiagonal`` (STAR and fully-coupled, else ``None``) is ``"preconditioned"`` or ``"plain"``
    (defaults: :data:`OFFDIAGONAL_DEFAULTS`): their ``precondition_offdiagonal`` option. ``last_layer`` (posteriors with
    a global-inducing last layer, :data:`GLOBAL_LAST_LAYER`, else ``None``) is ``"marginal"``
    (the default) or ``"sampled"``: their ``last_layer`` option. ``learning_rate_decay`` is ``None``
    (a constant learning rate) or ``[rate, every]``: the learning rate is multiplied by ``rate``
    every ``every`` steps (a staircase, as Lindinger et al.'s 0.98 every 1,000 steps; see
    :func:`learning_rate_of`). ``latent_dim`` (deep GPs only) is ``None`` (a plain deep GP) or ``D_w >= 1``:
    a latent-variable deep GP (``build_deep_gp(..., latent_dim=D_w)``), trained on the importance-weighted
    bound with ``importance_samples`` (K, default 1) draws per point; a plain model has
    ``importance_samples = None``. Lines written before these keys read as plain models (both ``None``).
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
            out["positive_transform"] = check_choice(out["positive_transform"], "positive_transform",
                                                     POSITIVE_TRANSFORMS)
    out["protocol"] = check_choice(out["protocol"], "protocol", PROTOCOLS)
    if model == "gp" and out["posterior"] in OFFDIAGONAL_DEFAULTS:
        out["offdiagonal"] = check_choice(out["offdiagonal"] or OFFDIAGONAL_DEFAULTS[out["posterior"]],
                                          "offdiagonal", OFFDIAGONAL_CHOICES)
    elif out["offdiagonal"] is not None:
        raise ValueError(f"offdiagonal applies to the {' and '.join(OFFDIAGONAL_DEFAULTS)} posteriors only, got "
                         f"{out['offdiagonal']!r} for posterior {out['posterior']!r}")
    if (model, out["posterior"]) in GLOBAL_LAST_LAYER:
        out["last_layer"] = check_choice(out["last_layer"] or "marginal", "last_layer", LAST_LAYER_CHOICES)
    elif out["last_layer"] is not None:
        raise ValueError(f"last_layer applies to a global-inducing last layer only, got {out['last_layer']!r} "
                         f"for model {model!r}, posterior {out['posterior']!r}")
    for k in ("num_inducing", "steps", "train_samples", "test_samples", "seed"):
        out[k] = int(out[k])
    out["learning_rate"] = float(out["learning_rate"])
    if out["learning_rate_decay"] is not None:
        out["learning_rate_decay"] = check_learning_rate_decay(out["learning_rate_decay"])
    if out["batch_size"] is not None:
        out["batch_size"] = int(out["batch_size"])
    _normalise_latent(out)
    return out


def _normalise_latent(out: Dict) -> None:
    """``latent_dim`` and ``importance_samples`` in place (see :func:`normalise_config`)."""
    from .validation import check_positive_int

    if out["latent_dim"] is None:
        if out["importance_samples"] is not None:
            raise ValueError(f"importance_samples={out['importance_samples']!r} needs a latent-variable deep GP: "
                             "set latent_dim too")
        return
    if out["model"] != "gp":
        raise ValueError(f"latent_dim applies to deep GPs (model 'gp') only, got model {out['model']!r}")
    out["latent_dim"] = check_positive_int(out["latent_dim"], "latent_dim")
    K = 1 if out["importance_samples"] is None else out["importance_samples"]
    out["importance_samples"] = check_positive_int(K, "importance_samples")


def with_legacy_values(record: Dict) -> Dict:
    """A copy of a result line (or configuration) with the keys added to :data:`CONFIG_KEYS` after it
    was written filled in from :data:`LEGACY_VALUES` (``positive_transform`` only for deep GPs). A key
    stored as null counts as missing: fully-coupled lines written before it carried ``offdiagonal``
    have ``null`` there and were trained with the plain storage."""
    out = dict(record)
    for k, v in LEGACY_VALUES.items():
        applies = {"positive_transform": out.get("model") == "gp",
                   "offdiagonal": out.get("model") == "gp" and out.get("posterior") in OFFDIAGONAL_DEFAULTS,
                   "last_layer": (out.get("model"), out.get("posterior")) in GLOBAL_LAST_LAYER}.get(k, True)
        if out.get(k) is None and applies:
            out[k] = v
    return out


def check_learning_rate_decay(decay) -> list:
    """``[rate, every]`` with ``rate`` in (0, 1] and ``every`` a positive integer number of steps, as
    floats and ints; anything else is a ``ValueError`` naming ``learning_rate_decay``."""
    if not (isinstance(decay, (list, tuple)) and len(decay) == 2):
        raise ValueError(f"learning_rate_decay must be [rate, every], got {decay!r}")
    rate, every = float(decay[0]), int(decay[1])
    if not (0.0 < rate <= 1.0) or every < 1 or every != decay[1]:
        raise ValueError(f"learning_rate_decay must be [rate in (0, 1], every >= 1 steps (an integer)], got {decay!r}")
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
        cfg["learning_rate"], decay_steps=every, decay_rate=rate, staircase=True)


def config_key(cfg: Dict) -> str:
    """A canonical string of the configuration (the keys of :data:`CONFIG_KEYS`), for matching lines
    (a key the line predates reads as in :func:`with_legacy_values`)."""
    cfg = with_legacy_values(cfg)
    return json.dumps({k: cfg.get(k) for k in CONFIG_KEYS}, sort_keys=True)
