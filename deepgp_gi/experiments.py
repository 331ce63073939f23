"""Fit and evaluate one UCI split: the routine shared by ``deepgp-gi uci`` and ``benchmarks/uci.py``.

:func:`run_split` builds the model a configuration names (a deep GP or a BNN), trains it with
:func:`deepgp_gi.fit` on the split's normalised training set, and returns one result record:

* the configuration itself (every key of :data:`~deepgp_gi.experiment_config.CONFIG_KEYS`), the split
  and the seed used;
* ``elbo_per_datapoint``: the final ELBO divided by N, estimated on the full training set from
  independent Monte Carlo draws until its standard error is below ``elbo_se_target``
  (``elbo_se_per_datapoint`` and ``elbo_samples`` say how far that went); NaN for a sampling
  family (``posterior="sghmc"`` or ``"bsgp"``), which has no ELBO: after training, :data:`SAMPLER_COLLECT` says
  how its sample set is collected (recorded as ``collected``, timed as ``collect_time_s``);
* ``test_ll`` and ``rmse`` in the original units of the targets, from ``test_samples`` samples of
  the predictive mixture (the papers use S = 100);
* ``train_time_s`` (the whole training, every process of a resumed run included), ``ms_per_step``
  (training wall time per Adam step after the first logged step, i.e. without
  tracing/compilation) and ``eval_time_s``;
* for the extrapolation protocol, ``test_ll_points`` (each test point's log predictive density,
  original units) and ``test_pit`` (each test target's predictive CDF value), for point-by-point
  comparisons of methods and calibration curves;
* ``trace``: the training ELBO per datapoint against step, averaged over blocks of steps (the raw
  one-sample minibatch estimates are noisy), for convergence plots;
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
import os
import time
from typing import Dict, List, Optional

import numpy as np

from .experiment_config import OFFDIAGONAL_DEFAULTS, learning_rate_of, normalise_config
from .metrics import estimate_elbo, smooth_trace

# Backwards compatibility: the configuration schema now lives in deepgp_gi.experiment_config and
# the ELBO estimate and trace summaries in deepgp_gi.metrics; these names, public here before,
# stay importable from this module.
from .experiment_config import (  # noqa: F401
    CONFIG_KEYS,
    DEFAULTS,
    GLOBAL_LAST_LAYER,
    LAST_LAYER_CHOICES,
    LEGACY_VALUES,
    OFFDIAGONAL_CHOICES,
    config_key,
    with_legacy_values,
)
from .metrics import steps_to_fraction  # noqa: F401

__all__ = ["run_split", "build_model", "layer_variances_on_training_rows", "read_json_lines", "set_threads",
           "SAMPLER_COLLECT", "LAYER_VARIANCE_ROWS"]

#: How :func:`run_split` collects a sampling family's sample set after training (``collect_samples``
#: arguments; Havasi et al. 2018's reference settings). ``train_time_s`` includes the collection.
SAMPLER_COLLECT = {"num_samples": 100, "thin": 50}

#: Training rows (at most) on which :func:`run_split` records a deep GP's ``layer_variances``.
LAYER_VARIANCE_ROWS = 2000


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


def build_model(cfg: Dict, split: int):
    """The untrained model configuration ``cfg`` names on UCI split ``split``, as :func:`run_split`
    builds it (same seed), and the split's data: ``(model, data)``. Restoring a run's checkpoint
    into this model gives the trained one."""
    from . import datasets
    from .builders import build_deep_gp

    cfg = normalise_config(cfg)
    data = datasets.load_uci(cfg["dataset"], split, protocol=cfg["protocol"])
    N = data.X_train.shape[0]
    seed = cfg["seed"] + split
    if cfg["model"] == "gp":
        M = min(cfg["num_inducing"], N) if cfg["posterior"] != "global" else cfg["num_inducing"]
        options = {}
        if cfg["posterior"] in OFFDIAGONAL_DEFAULTS:
            options["precondition_offdiagonal"] = cfg["offdiagonal"] == "preconditioned"
        if cfg["posterior"] == "global":
            options["last_layer"] = cfg["last_layer"]
        if cfg["latent_dim"] is not None:  # a latent-variable deep GP, trained on the K-sample bound
            options["latent_dim"] = cfg["latent_dim"]
        model = build_deep_gp(data.X_train, data.Y_train, depth=cfg["depth"], posterior=cfg["posterior"],
                              num_inducing=M, seed=seed, positive_transform=cfg["positive_transform"], **options)
    else:
        from .bnn import build_bnn

        options = {"last_layer": cfg["last_layer"]} if cfg["last_layer"] is not None else {}
        model = build_bnn(data.X_train, data.Y_train, hidden=tuple(cfg["hidden"]), posterior=cfg["posterior"],
                          prior=cfg["prior"], num_inducing=cfg["num_inducing"], seed=seed, **options)
    return model, data


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
    return rows, metrics.layer_variances(model, data.X_train[:rows], layer_samples, seed=cfg["seed"] + split)


def training_device() -> str:
    """Where this process trains: ``"GPU: <name>"`` when TensorFlow sees a GPU (it places the step
    there), else ``"CPU"``. A record's ``ms_per_step`` only compares with records of the same device."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "CPU"
    name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", gpus[0].name)
    return f"GPU: {name}"


def run_split(cfg: Dict, split: int, *, progress: bool = False, checkpoint_dir: Optional[str] = None,
              elbo_se_target: float = 0.01, trace_points: int = 200) -> Dict:
    """Fit configuration ``cfg`` (see :func:`normalise_config`) on UCI split ``split``; return the record."""
    from . import metrics
    from .families import BNN_FAMILIES, DEEP_GP_FAMILIES
    from .training import fit

    cfg = normalise_config(cfg)
    model, data = build_model(cfg, split)
    N = data.X_train.shape[0]
    batch_size = min(cfg["batch_size"] or 10000, N)
    seed = cfg["seed"] + split
    t0 = time.perf_counter()
    history = fit(model, (data.X_train, data.Y_train), steps=cfg["steps"], batch_size=batch_size,
                  learning_rate=learning_rate_of(cfg), num_samples=cfg["train_samples"], seed=seed,
                  progress=progress, checkpoint_dir=checkpoint_dir, importance_samples=cfg["importance_samples"])
    sampler = bool(getattr(model.posterior, "is_sampler", False))
    collect_time = 0.0
    if sampler:  # the sample set the predictions mix over (Havasi et al.'s 100 samples, 50 steps apart)
        from .training import collect_samples

        t_collect = time.perf_counter()
        collect_samples(model, (data.X_train, data.Y_train), num_samples=SAMPLER_COLLECT["num_samples"],
                        thin=SAMPLER_COLLECT["thin"], seed=seed, batch_size=batch_size, progress=progress)
        collect_time = time.perf_counter() - t_collect
    # a run resumed from a checkpoint: its history's clock covers the earlier processes too, this
    # process's clock only the rest
    train_time = max(time.perf_counter() - t0, (history.wall_time[-1] if history.wall_time else 0.0) + collect_time)
    w, s = history.wall_time, history.step
    ms_per_step = 1000.0 * (w[-1] - w[0]) / (s[-1] - s[0]) if len(s) > 1 and s[-1] > s[0] else float("nan")

    t1 = time.perf_counter()
    # evaluation memory: the family's (row, sample) budget per call, in row chunks
    row_samples = (DEEP_GP_FAMILIES if cfg["model"] == "gp" else BNN_FAMILIES)[cfg["posterior"]].eval_row_samples
    samples_per_draw = 8
    if sampler:  # a sampling family has no ELBO: its history holds the log joint of the chain
        elbo, elbo_se, elbo_samples = float("nan"), float("nan"), 0
    else:
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
    spread = None
    if cfg["model"] == "gp":
        rows, spread = layer_variances_on_training_rows(model, data, cfg, split)
    eval_time = time.perf_counter() - t1
    trace_steps, trace_elbo = smooth_trace(history.step, history.elbo_per_datapoint, trace_points)

    record = dict(cfg)
    record.update(
        split=split, seed_used=seed, n_train=int(N), n_test=int(data.X_test.shape[0]), batch_size_used=batch_size,
        test_ll=float(test_ll), rmse=float(err), elbo_per_datapoint=elbo, elbo_se_per_datapoint=elbo_se,
        elbo_samples=elbo_samples, final_train_elbo_per_datapoint=float(history.elbo_per_datapoint[-1]),
        train_time_s=round(train_time, 2), ms_per_step=round(ms_per_step, 3), eval_time_s=round(eval_time, 2),
        resumed_from=int(history.resumed_from), device=training_device(),
        **({"collected": dict(SAMPLER_COLLECT), "collect_time_s": round(collect_time, 2)} if sampler else {}),
        trace={"step": trace_steps, "elbo_per_datapoint": [round(v, 5) for v in trace_elbo]},
    )
    if spread is not None:
        record["layer_variances"] = {"rows": rows, "between_rows": [float(f"{v:.4g}") for v in spread.between_rows],
                                     "within_samples": [float(f"{v:.4g}") for v in spread.within_samples]}
    if pointwise:
        record.update(test_ll_points=[round(float(v), 5) for v in lpd], test_pit=[round(float(v), 5) for v in pit])
    return record
