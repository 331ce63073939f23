"""Fit and evaluate one UCI split: the routine shared by ``deepgp-gi uci`` and ``benchmarks/uci.py``.

:func:`run_split` builds the model a configuration names (a deep GP or a BNN), trains it with
:func:`deepgp_gi.fit` on the split's normalised training set, and returns one result record:

* the configuration itself (every key of :data:`CONFIG_KEYS`), the split and the seed used;
* ``elbo_per_datapoint``: the final ELBO divided by N, estimated on the full training set from
  independent Monte Carlo draws until its standard error is below ``elbo_se_target``
  (``elbo_se_per_datapoint`` and ``elbo_samples`` say how far that went);
* ``test_ll`` and ``rmse`` in the original units of the targets, from ``test_samples`` samples of
  the predictive mixture (the papers use S = 100);
* ``train_time_s``, ``ms_per_step`` (training wall time per Adam step after the first logged
  step, i.e. without tracing/compilation) and ``eval_time_s``;
* for the extrapolation protocol, ``test_ll_points`` (each test point's log predictive density,
  original units) and ``test_pit`` (each test target's predictive CDF value), for point-by-point
  comparisons of methods and calibration curves;
* ``trace``: the training ELBO per datapoint against step, averaged over blocks of steps (the raw
  one-sample minibatch estimates are noisy), for convergence plots.
"""
from __future__ import annotations

import json
import math
import os
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

from .validation import check_positive_int

__all__ = ["read_json_lines", "CONFIG_KEYS", "DEFAULTS", "normalise_config", "config_key", "with_legacy_values", "LEGACY_VALUES", "OFFDIAGONAL_CHOICES", "OFFDIAGONAL_DEFAULTS", "LAST_LAYER_CHOICES", "GLOBAL_LAST_LAYER", "run_split", "estimate_elbo",
           "smooth_trace", "steps_to_fraction", "set_threads"]

#: The keys that identify a configuration (together with the split).
CONFIG_KEYS = ("model", "dataset", "posterior", "depth", "prior", "hidden", "num_inducing", "steps", "batch_size",
               "learning_rate", "train_samples", "test_samples", "seed", "positive_transform", "protocol",
               "offdiagonal", "last_layer")

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
                positive_transform=None, protocol="random", offdiagonal=None, last_layer=None)


def set_threads(threads: Optional[int]) -> None:
    """Limit TensorFlow to ``threads`` intra- and inter-op threads (``None`` or 0: leave it). When
    TensorFlow is already initialised in this process (e.g. under pytest), warn instead of failing."""
    import sys

    import tensorflow as tf

    if threads:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        except RuntimeError as err:
            if tf.config.threading.get_intra_op_parallelism_threads() != threads:
                print(f"warning: --threads {threads} not applied: {err}", file=sys.stderr)


def read_json_lines(path: str) -> List[Dict]:
    """The JSON records of a results file, one per line (a truncated last line, from a killed run,
    is ignored; a missing file is empty)."""
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    return out


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
    (the default) or ``"sampled"``: their ``last_layer`` option.
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
    if out["batch_size"] is not None:
        out["batch_size"] = int(out["batch_size"])
    return out


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


def config_key(cfg: Dict) -> str:
    """A canonical string of the configuration (the keys of :data:`CONFIG_KEYS`), for matching lines
    (a key the line predates reads as in :func:`with_legacy_values`)."""
    cfg = with_legacy_values(cfg)
    return json.dumps({k: cfg.get(k) for k in CONFIG_KEYS}, sort_keys=True)


def estimate_elbo(model, data, *, se_target: float = 0.01, samples_per_draw: int = 8, min_draws: int = 4,
                  max_draws: int = 2500, seed: int = 0, chunk_size: Optional[int] = None):
    """The ELBO per datapoint on the full data, from independent draws until its SE < ``se_target``.

    Each draw is ``model.elbo(data, samples_per_draw, seed_r)`` with its own stateless seed, so the
    draws are independent; the estimate is their mean and its standard error is their standard
    deviation over the square root of their number.

    With ``chunk_size`` (rows) smaller than N, each draw evaluates the rows in chunks, with
    independent samples per chunk: the sum of the chunks' expected log-likelihoods (each
    ``model.elbo_terms`` of a chunk, un-rescaled when ``model.num_data`` is set) minus the first
    chunk's regulariser. Its expectation is the full-data ELBO's, so only the memory of a draw
    changes (and, for a family with a sampled regulariser, its variance). This needs
    ``model.num_data`` to be None or N (checked).

    :param chunk_size: rows per evaluation call; None: all N at once.
    :return: ``(mean, standard_error, total_samples)``, all per datapoint.
    """
    import tensorflow as tf

    X, Y = data
    N = int(X.shape[0])
    if model.num_data not in (None, N):
        raise ValueError(f"model.num_data={model.num_data} but the data has N={N} rows")
    if chunk_size is not None:
        chunk_size = check_positive_int(chunk_size, "chunk_size")
    if chunk_size is None or chunk_size >= N:

        elbo = tf.function(lambda seed_pair: model.elbo((X, Y), samples_per_draw, seed_pair), autograph=False)

        def draw(seed_pair) -> float:
            return float(elbo(seed_pair))

    else:
        starts = list(range(0, N, chunk_size))

        @tf.function(autograph=False)
        def terms(Xc, Yc, seed_pair):
            ell, kl = model.elbo_terms((Xc, Yc), samples_per_draw, seed_pair)
            if model.num_data is not None:  # undo the minibatch rescaling: this is a sum over the chunk
                ell = ell * tf.cast(tf.shape(Xc)[0], ell.dtype) / tf.cast(model.num_data, ell.dtype)
            return tf.reduce_mean(ell), tf.reduce_mean(kl)

        def draw(seed_pair) -> float:
            total = 0.0
            for k, start in enumerate(starts):
                ell, kl = terms(X[start:start + chunk_size], Y[start:start + chunk_size],
                                seed_pair + tf.constant([1_000_003 * k, 0], tf.int64))
                total += float(ell) - (float(kl) if k == 0 else 0.0)
            return total

    values: List[float] = []
    while True:
        values.append(draw(tf.constant([seed, 7919 + len(values)], tf.int64)) / N)
        n = len(values)
        if n >= min_draws:
            se = float(np.std(values, ddof=1) / math.sqrt(n))
            if se < se_target or n >= max_draws:
                return float(np.mean(values)), se, n * samples_per_draw


def smooth_trace(steps: Sequence[int], values: Sequence[float], points: int = 200):
    """Average a logged trace over ``points`` consecutive blocks (fewer when the trace is shorter)."""
    steps = np.asarray(steps, dtype=float)
    values = np.asarray(values, dtype=float)
    if len(steps) == 0:
        return [], []
    blocks = np.array_split(np.arange(len(steps)), min(points, len(steps)))
    return ([int(steps[b[-1]]) for b in blocks], [float(np.mean(values[b])) for b in blocks])


def steps_to_fraction(steps: Sequence[int], values: Sequence[float], fraction: float = 0.99) -> Optional[int]:
    """First step at which a (smoothed) ELBO trace has made ``fraction`` of its total improvement.

    "Reaching 99% of the final ELBO" is read as ``elbo(t) >= e0 + 0.99 (e_final - e0)`` with ``e0`` the
    first and ``e_final`` the last value of the trace (ELBOs change sign, so a plain ratio is
    meaningless). ``e_final`` is the mean of the last 5% of the trace, to damp Monte Carlo noise.
    """
    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        return None
    tail = max(1, len(v) // 20)
    e0, ef = v[0], float(np.mean(v[-tail:]))
    if ef <= e0:
        return None
    threshold = e0 + fraction * (ef - e0)
    hit = np.nonzero(v >= threshold)[0]
    return int(steps[hit[0]]) if len(hit) else None


def run_split(cfg: Dict, split: int, *, progress: bool = False, checkpoint_dir: Optional[str] = None,
              elbo_se_target: float = 0.01, trace_points: int = 200) -> Dict:
    """Fit configuration ``cfg`` (see :func:`normalise_config`) on UCI split ``split``; return the record."""
    from . import datasets, metrics
    from .builders import build_deep_gp
    from .families import BNN_FAMILIES, DEEP_GP_FAMILIES
    from .training import fit

    cfg = normalise_config(cfg)
    data = datasets.load_uci(cfg["dataset"], split, protocol=cfg["protocol"])
    N = data.X_train.shape[0]
    batch_size = min(cfg["batch_size"] or 10000, N)
    seed = cfg["seed"] + split
    if cfg["model"] == "gp":
        M = min(cfg["num_inducing"], N) if cfg["posterior"] != "global" else cfg["num_inducing"]
        options = {}
        if cfg["posterior"] in OFFDIAGONAL_DEFAULTS:
            options["precondition_offdiagonal"] = cfg["offdiagonal"] == "preconditioned"
        if cfg["posterior"] == "global":
            options["last_layer"] = cfg["last_layer"]
        model = build_deep_gp(data.X_train, data.Y_train, depth=cfg["depth"], posterior=cfg["posterior"],
                              num_inducing=M, seed=seed, positive_transform=cfg["positive_transform"], **options)
    else:
        from .bnn import build_bnn

        options = {"last_layer": cfg["last_layer"]} if cfg["last_layer"] is not None else {}
        model = build_bnn(data.X_train, data.Y_train, hidden=tuple(cfg["hidden"]), posterior=cfg["posterior"],
                          prior=cfg["prior"], num_inducing=cfg["num_inducing"], seed=seed, **options)
    t0 = time.perf_counter()
    history = fit(model, (data.X_train, data.Y_train), steps=cfg["steps"], batch_size=batch_size,
                  learning_rate=cfg["learning_rate"], num_samples=cfg["train_samples"], seed=seed,
                  progress=progress, checkpoint_dir=checkpoint_dir)
    train_time = time.perf_counter() - t0
    w, s = history.wall_time, history.step
    ms_per_step = 1000.0 * (w[-1] - w[0]) / (s[-1] - s[0]) if len(s) > 1 and s[-1] > s[0] else float("nan")

    t1 = time.perf_counter()
    # evaluation memory: the family's (row, sample) budget per call, in row chunks
    row_samples = (DEEP_GP_FAMILIES if cfg["model"] == "gp" else BNN_FAMILIES)[cfg["posterior"]].eval_row_samples
    samples_per_draw = 8
    elbo, elbo_se, elbo_samples = estimate_elbo(model, (data.X_train, data.Y_train), se_target=elbo_se_target,
                                                seed=seed, samples_per_draw=samples_per_draw,
                                                chunk_size=max(1, row_samples // samples_per_draw))
    S = cfg["test_samples"]
    chunk = max(1, min(1000, row_samples // S))
    pointwise = cfg["protocol"] != "random"
    if pointwise:  # per-point results, for comparing methods point by point and calibration curves
        lpd = metrics.pointwise_log_density(model, data.X_test, data.Y_test, data.y_std, S, chunk, seed=seed)
        pit = metrics.predictive_cdf(model, data.X_test, data.Y_test, S, chunk, seed=seed)
        test_ll = float(np.mean(lpd))
    else:
        test_ll = metrics.test_log_likelihood(model, data.X_test, data.Y_test, data.y_std, S, chunk)
    err = metrics.rmse(model, data.X_test, data.Y_test, data.y_std, S, chunk)
    eval_time = time.perf_counter() - t1
    trace_steps, trace_elbo = smooth_trace(history.step, history.elbo_per_datapoint, trace_points)

    record = dict(cfg)
    record.update(
        split=split, seed_used=seed, n_train=int(N), n_test=int(data.X_test.shape[0]), batch_size_used=batch_size,
        test_ll=float(test_ll), rmse=float(err), elbo_per_datapoint=elbo, elbo_se_per_datapoint=elbo_se,
        elbo_samples=elbo_samples, final_train_elbo_per_datapoint=float(history.elbo_per_datapoint[-1]),
        train_time_s=round(train_time, 2), ms_per_step=round(ms_per_step, 3), eval_time_s=round(eval_time, 2),
        resumed_from=int(history.resumed_from),
        trace={"step": trace_steps, "elbo_per_datapoint": [round(v, 5) for v in trace_elbo]},
    )
    if pointwise:
        record.update(test_ll_points=[round(float(v), 5) for v in lpd], test_pit=[round(float(v), 5) for v in pit])
    return record
