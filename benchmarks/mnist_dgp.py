"""Deep GPs on the full MNIST with the robust-max likelihood: DSVI's classification experiment.

Salimbeni & Deisenroth (2017), "Doubly stochastic variational inference for deep Gaussian
processes", report test accuracies of 97.48% (one layer, a sparse GP), 98.06% (two layers) and
98.11% (three layers) on MNIST (60,000 training / 10,000 test images, 784 inputs, 10 classes) with
GPflow's robust-max multiclass likelihood, M = 100 inducing points, minibatches of 10,000 and Adam
at 0.01. This script repeats that protocol for DSVI's mean-field posterior (depths 1, 2, 3) and for
global inducing points (O&A 2021; depths 2, 3), three seeds each:

* inputs: the pixels divided by 255, so in [0, 1] (no standardisation), flattened to 784 columns;
  the targets are the labels 0..9;
* likelihood ``gpflow.likelihoods.MultiClass(10)`` (its default ``RobustMax`` invlink, epsilon
  1e-3);
* ``build_deep_gp(X, Y, depth=L, posterior=..., num_inducing=100, likelihood=..., seed=seed)``, so
  the builder's DSVI initialisation: ARD squared-exponential kernels (variance 2, lengthscales 2),
  white noise 1e-5 between layers, inner width min(30, 784) = 30 with fixed PCA mean maps; for
  mean-field, inducing inputs from k-means of the training images (k-means++ start, seeded),
  ``q_mu = 0`` and ``q_sqrt`` the prior's Cholesky, scaled by 1e-5 on the inner layers (the
  posterior's ``q_sqrt_scales`` default) so they start at their mean functions; for global
  inducing, O&A's initialisation (100 training images, their one-hot labels as the last layer's
  pseudo-outputs);
* Adam at 0.01, minibatches of 10,000 (a seeded per-epoch permutation), one Monte Carlo sample a
  step; ``--steps`` steps (the design's DSVI schedule is 20,000 iterations for small and medium
  data sets; the default here is smaller, see :data:`DEFAULT_STEPS`);
* test accuracy, test log-likelihood (the log of the label's probability under the predictive
  mixture) and expected calibration error (15 equal-width bins) on the 10,000 test images,
  evaluated in chunks of ``--eval-chunk`` images so memory stays bounded: with ``--test-samples``
  (100) draws at the end, with ``--trace-samples`` (10) every ``--eval-every`` steps.

Every cell runs in a process of its own (so its memory goes back to the system when it ends;
``--in-process`` runs them all in one) and trains in segments of ``--eval-every`` steps. ``fit``
checkpoints each segment's end to the cell's folder under ``--checkpoint-dir`` and resumes from
there, so the sweep can be stopped and restarted at will: a cell in the results file is skipped,
an interrupted one resumes from its last checkpoint. The checkpoint folder does not depend on
``--steps``: a later sweep with more steps continues a finished cell's run (the minibatches and
noise are functions of the seed and step, so it is the run an uninterrupted longer sweep would have
made). After each segment one JSON line goes to the trace file (``--trace``: step, accuracy, test
LL, ECE, the minibatch ELBO, the segment's ms/step and the cumulative times), and at the end of a
cell ONE JSON line to the results file. A cell whose trace goes past its checkpoint (the folder that
run wrote is gone, or ``--checkpoint-dir`` names another) stops with an error before training;
``--drop-lost-trace`` removes those trace lines and trains the steps again.

    python tools/fetch_mnist.py            # once: MNIST to ~/.cache/deepgp_gi/mnist.npz
    nice -n 19 python benchmarks/mnist_dgp.py sweep
    python benchmarks/mnist_dgp.py report  # writes benchmarks/results/images/mnist_dgp.md

Smoke runs: ``--subset N`` / ``--test-subset N`` keep the first N training / test images, ``--data``
reads another ``.npz`` of MNIST's layout (``x_train`` ``[N, 28, 28]`` uint8 ...), and ``--steps``,
``--eval-every``, ``--batch-size``, ``--num-inducing`` shrink the run.

Run from the repository root: the default paths are relative to it.
"""

from __future__ import annotations

if not __package__:  # run by path: load benchmarks/ as the package (benchmarks/_by_path.py)
    import _by_path  # noqa: F401

import argparse
import datetime
import json
import math
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from benchmarks import mnist_summary  # noqa: E402
from benchmarks.common import (  # noqa: E402
    add_drop_lost_trace_option,
    append_line,
    code_commit,
    mean_se,
    portable,
    read_lines,
    set_threads,
    trace_to_checkpoint,
)

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

RESULTS = "benchmarks/results/images/mnist_dgp.jsonl"
TRACE = "benchmarks/results/images/mnist_dgp_trace.jsonl"
REPORT = "benchmarks/results/images/mnist_dgp.md"
CHECKPOINTS = "benchmarks/results/images/checkpoints/mnist_dgp"

#: Depths run per posterior family by default.
DEPTHS = {"mean_field": (1, 2, 3), "global": (2, 3)}
#: The order of the configurations within a seed (seed 0 first, then 1, 2).
CONFIG_ORDER = (
    ("mean_field", 1),
    ("mean_field", 2),
    ("global", 2),
    ("mean_field", 3),
    ("global", 3),
)
#: DSVI's MNIST test accuracies (%) by depth (Salimbeni & Deisenroth 2017; depth 1 is their SGP).
PAPER_ACCURACY = mnist_summary.DSVI_ACCURACY
#: The design's DSVI schedule for small and medium data sets (MNIST has 60,000 training images).
PAPER_STEPS = 20_000
#: Steps per cell here: a quarter of the paper's, so that the 15 cells fit in about a day of the
#: shared 2-core CPU (see :data:`PRESWEEP_MS_PER_STEP`).
DEFAULT_STEPS = 5_000
#: ms/step timed over a few steps of each configuration before the sweep (batch 10,000, M = 100,
#: the whole of MNIST), on the 2-core CPU shared with other jobs (load average 1 for depth 1, 4 to
#: 5 for the others); the report's estimate of the paper's schedule uses them.
PRESWEEP_MS_PER_STEP = {
    ("mean_field", 1): 311,
    ("mean_field", 2): 969,
    ("mean_field", 3): 2556,
    ("global", 2): 299,
    ("global", 3): 736,
}
#: Options whose values are paths (made repository-relative in the recorded command).
PATH_OPTIONS = ("--out", "--trace", "--checkpoint-dir", "--data", "--results", "--plot")
ECE_BINS = 15

REPO_ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------ recorded commands


def portable_path(path: str) -> str:
    """``path`` as a result line records it: a relative path as given, an absolute one through
    :func:`benchmarks.common.portable` (relative inside the checkout, ``TMP_DIR/<name>`` elsewhere,
    ``CKPT_DIR`` for a checkpoint folder), so no machine paths reach the results."""
    path = os.path.expanduser(path)
    return path if not os.path.isabs(path) else portable(os.path.abspath(path))


def recorded_command(subcommand_argv: Sequence[str]) -> str:
    """``python benchmarks/mnist_dgp.py ARGS`` with every path option's value made portable."""
    out, take = [], False
    for token in subcommand_argv:
        if take:
            out.append(portable_path(token))
            take = False
            continue
        name, eq, value = token.partition("=")
        if name in PATH_OPTIONS and eq:
            out.append(f"{name}={portable_path(value)}")
        else:
            out.append(token)
            take = token in PATH_OPTIONS
    return " ".join(["python", "benchmarks/mnist_dgp.py"] + out)


# ----------------------------------------------------------------------------------------- cells


def planned_cells(
    posteriors: Sequence[str], depths: Sequence[int], seeds: Sequence[int]
) -> List[Tuple[str, int, int]]:
    """``(posterior, depth, seed)`` in sweep order: seed by seed, each seed in :data:`CONFIG_ORDER`
    (so mean-field 1, mean-field 2, global 2 of seed 0 come first), then any other requested
    pair."""
    configs = [c for c in CONFIG_ORDER if c[0] in posteriors and c[1] in depths]
    configs += [
        (p, d)
        for p in posteriors
        for d in depths
        if (p, d) not in configs and d in DEPTHS.get(p, (d,))
    ]
    return [(p, d, s) for s in seeds for (p, d) in configs]


def data_label(args) -> str:
    return "mnist" if not args.data else portable_path(args.data)


def run_key(r: Dict) -> tuple:
    """A training run: everything that changes the trajectory (not the number of steps)."""
    return (
        r["data"],
        r["train_rows"],
        r["posterior"],
        r["depth"],
        r["seed"],
        r["num_inducing"],
        r["batch_size"],
        float(r["lr"]),
    )


def cell_key(r: Dict) -> tuple:
    """A result: the run, its number of steps and the test set it was scored on."""
    return run_key(r) + (r["steps"], r["test_rows"], r["test_samples"])


def checkpoint_folder(args, posterior: str, depth: int, seed: int, train_rows: int) -> Path:
    name = (
        f"{re.sub(r'[^A-Za-z0-9._-]+', '_', data_label(args))}"
        f"-n{train_rows}-{posterior}-d{depth}-s{seed}"
        f"-M{args.num_inducing}-b{args.batch_size}-lr{args.lr:g}"
    )
    return Path(args.checkpoint_dir) / name


def checkpoint_step(folder: Path) -> int:
    """The step of the latest checkpoint in ``folder`` (0 if none), read from its name."""
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(str(folder)) if folder.is_dir() else None
    return int(latest.rsplit("-", 1)[1]) if latest else 0


# ------------------------------------------------------------------------------------- the model


def load_data(args):
    import deepgp_gi as dg

    d = dg.datasets.load_mnist(args.data)  # pixels / 255 in [0, 1]; labels 0..9 as float [N, 1]
    Xtr = d.X_train.reshape(len(d.X_train), -1)
    Xte = d.X_test.reshape(len(d.X_test), -1)
    Ytr, Yte = d.Y_train, d.Y_test
    if args.subset:
        Xtr, Ytr = Xtr[: args.subset], Ytr[: args.subset]
    if args.test_subset:
        Xte, Yte = Xte[: args.test_subset], Yte[: args.test_subset]
    return Xtr, Ytr, Xte, Yte


def build(X, Y, posterior: str, depth: int, seed: int, num_inducing: int):
    import gpflow

    import deepgp_gi as dg

    return dg.build_deep_gp(
        X,
        Y,
        depth=depth,
        posterior=posterior,
        num_inducing=num_inducing,
        likelihood=gpflow.likelihoods.MultiClass(10),
        seed=seed,
    )


def evaluate(model, X, Y, num_samples: int, chunk: int, seed: int) -> Dict:
    """Accuracy, test log-likelihood, ECE and predictive entropy from the predictive class
    probabilities, computed ``chunk`` test images at a time."""
    from deepgp_gi import metrics

    probs = metrics.predict_class_probabilities(model, X, num_samples, chunk_size=chunk, seed=seed)
    labels = np.asarray(Y[:, 0], dtype=np.int64)
    lpd = np.log(np.maximum(probs[np.arange(len(labels)), labels], np.finfo(np.float64).tiny))
    return {
        "accuracy": metrics.top1_accuracy(probs, labels),
        "test_ll": float(np.mean(lpd)),
        "ece": metrics.expected_calibration_error(probs, labels, num_bins=ECE_BINS),
        "entropy": float(np.mean(metrics.categorical_entropy(probs))),
    }


def segment_ms_per_step(history, start: int) -> Optional[float]:
    """Steady-state ms/step of the steps after ``start`` in ``history``: between the first and the
    last entry logged after ``start`` (the first step's tracing excluded); None with fewer than
    two."""
    idx = [i for i, s in enumerate(history.step) if s > start]
    if len(idx) < 2:
        return None
    i, j = idx[0], idx[-1]
    return (
        1000.0 * (history.wall_time[j] - history.wall_time[i]) / (history.step[j] - history.step[i])
    )


def run_cell(args, data, posterior: str, depth: int, seed: int, command: str) -> Dict:
    import deepgp_gi as dg

    Xtr, Ytr, Xte, Yte = data
    N = len(Xtr)
    base = {
        "benchmark": "mnist_dgp",
        "data": data_label(args),
        "train_rows": N,
        "test_rows": len(Xte),
        "posterior": posterior,
        "depth": depth,
        "seed": seed,
        "num_inducing": args.num_inducing,
        "batch_size": min(args.batch_size, N),
        "lr": args.lr,
    }
    folder = checkpoint_folder(args, posterior, depth, seed, N)
    done = checkpoint_step(folder)
    if done > args.steps:
        raise SystemExit(
            f"{folder} holds a run at step {done}, past --steps {args.steps}: use another "
            "--checkpoint-dir (or more steps)"
        )
    trace = trace_to_checkpoint(args.trace, run_key, run_key(base), done, args.drop_lost_trace)
    traced = {t["step"]: t for t in trace}
    last = trace[-1] if trace else {}
    clock = {k: last.get(k, 0.0) for k in ("train_seconds", "eval_seconds", "wall_seconds")}
    resumes = list(last.get("resumes", [])) + ([done] if done else [])
    started, wall0 = time.perf_counter(), clock["wall_seconds"]
    model = build(Xtr, Ytr, posterior, depth, seed, args.num_inducing)
    elbo = last.get("elbo_per_datapoint")

    def record(step: int, samples: int, ms: Optional[float]) -> Dict:
        t = time.perf_counter()
        scores = evaluate(model, Xte, Yte, samples, args.eval_chunk, seed)
        clock["eval_seconds"] += time.perf_counter() - t
        clock["wall_seconds"] = wall0 + time.perf_counter() - started
        line = dict(
            base,
            step=step,
            test_samples=samples,
            **scores,
            elbo_per_datapoint=elbo,
            segment_ms_per_step=ms,
            resumes=resumes,
            **clock,
        )
        append_line(args.trace, line)
        traced[step] = line
        return line

    def train_to(steps: int):
        return dg.fit(
            model,
            (Xtr, Ytr),
            steps=steps,
            batch_size=base["batch_size"],
            learning_rate=args.lr,
            num_samples=1,
            seed=seed,
            checkpoint_dir=folder,
            checkpoint_every=args.eval_every,
            log_every=args.log_every,
            progress=True,
        )

    if done:  # restore the checkpoint first (fit returns at once: nothing is left up to it), so
        train_to(done)  # a line recorded before the next segment scores the trained model
    if done == 0 and 0 not in traced:
        record(0, args.trace_samples if args.steps > 0 else args.test_samples, None)
    elif done and done not in traced and (done % args.eval_every == 0 or done == args.steps):
        record(done, args.test_samples if done == args.steps else args.trace_samples, None)
    while done < args.steps:
        target = min(args.steps, (done // args.eval_every + 1) * args.eval_every)
        t = time.perf_counter()
        history = train_to(target)
        clock["train_seconds"] += time.perf_counter() - t
        elbo = history.elbo[-1] / N if history.elbo else elbo
        ms = segment_ms_per_step(history, done)
        done = target
        record(done, args.test_samples if done == args.steps else args.trace_samples, ms)
    final = traced.get(args.steps)
    if (
        final is None or final["test_samples"] != args.test_samples
    ):  # an older run's line, other samples
        final = record(args.steps, args.test_samples, None)
    lines = [
        t
        for t in read_lines(args.trace)
        if run_key(t) == run_key(base) and 0 < t["step"] <= args.steps
    ]
    seg = [t["segment_ms_per_step"] for t in lines if t.get("segment_ms_per_step")]
    row = dict(
        base,
        steps=args.steps,
        test_samples=args.test_samples,
        train_samples=1,
        likelihood="MultiClass(10), RobustMax",
        inputs="pixels / 255",
        accuracy=final["accuracy"],
        test_ll=final["test_ll"],
        ece=final["ece"],
        ece_bins=ECE_BINS,
        entropy=final["entropy"],
        elbo_per_datapoint=final["elbo_per_datapoint"],
        ms_per_step=float(np.median(seg)) if seg else None,
        train_seconds=final["train_seconds"],
        eval_seconds=final["eval_seconds"],
        wall_seconds=final["wall_seconds"],
        resumes=final["resumes"],
        process_peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        command=command,
        commit=code_commit(),
        finished=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    return row


def sweep(args, argv: Sequence[str]) -> None:
    """Run the cells not yet in ``args.out``: each in a process of its own (the default: a cell's
    memory goes back to the system when it ends), or all in this one with ``--in-process``."""
    from tqdm.auto import tqdm

    set_threads(args.threads)
    import tensorflow as tf

    tf.get_logger().setLevel(
        "ERROR"
    )  # each segment's fit traces its step anew; that is expected here
    command = args.command_text or recorded_command(argv)
    cells = planned_cells(
        args.posteriors.split(","),
        [int(d) for d in args.depths.split(",")],
        [int(s) for s in args.seeds.split(",")],
    )
    data = load_data(args)
    N, N_test = len(data[0]), len(data[2])
    if not args.in_process:
        del data
    failed = []
    bar = tqdm(cells, desc="cells", dynamic_ncols=True)
    for posterior, depth, seed in bar:
        key = (
            data_label(args),
            N,
            posterior,
            depth,
            seed,
            args.num_inducing,
            min(args.batch_size, N),
            float(args.lr),
            args.steps,
            N_test,
            args.test_samples,
        )
        if key in {cell_key(r) for r in read_lines(args.out)}:
            bar.write(f"skip {posterior} depth {depth} seed {seed}: in {portable_path(args.out)}")
            continue
        bar.set_description(f"{posterior} d{depth} s{seed}")
        bar.write(f"== {posterior} depth {depth} seed {seed}: {args.steps} steps")
        if args.in_process:
            row = run_cell(args, data, posterior, depth, seed, command)
            append_line(args.out, row)
            bar.write(json.dumps(row))
            continue
        rc = run_cell_process(argv, posterior, depth, seed, command)
        if rc in (-2, 130):  # interrupted (Ctrl-C): stop the sweep
            raise SystemExit(rc)
        if rc != 0:  # e.g. killed for memory: the next cells still run; a rerun resumes this one
            bar.write(f"!! {posterior} depth {depth} seed {seed} failed (exit status {rc})")
            failed.append((posterior, depth, seed))
    if failed:
        raise SystemExit(f"{len(failed)} cell(s) failed: {failed}; rerun the sweep to resume them")


def run_cell_process(
    argv: Sequence[str], posterior: str, depth: int, seed: int, command: str
) -> int:
    """Run one cell as ``python benchmarks/mnist_dgp.py <argv> --in-process`` restricted to it, with
    the ``deepgp_gi`` this process imported first on the child's path; its exit status."""
    import deepgp_gi

    env = dict(os.environ)
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(deepgp_gi.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([package_root] + [p for p in [env.get("PYTHONPATH")] if p])
    child = [
        sys.executable,
        os.path.abspath(__file__),
        *argv,
        "--posteriors",
        posterior,
        "--depths",
        str(depth),
        "--seeds",
        str(seed),
        "--in-process",
        "--command-text",
        command,
    ]
    return subprocess.call(child, env=env)


# ---------------------------------------------------------------------------------------- report


def _fmt(m: float, s: float, digits: int) -> str:
    if math.isnan(m):
        return "–"
    return f"{m:.{digits}f}" + ("" if math.isnan(s) else f" ± {s:.{digits}f}")


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h"


def report(args, argv: Sequence[str]) -> str:
    rows = [r for r in read_lines(args.results) if r.get("benchmark") == "mnist_dgp"]
    trace = read_lines(args.trace)
    seeds = [int(s) for s in args.seeds.split(",")]
    planned = planned_cells(
        args.posteriors.split(","), [int(d) for d in args.depths.split(",")], seeds
    )
    groups: Dict[tuple, List[Dict]] = {}
    for r in rows:
        groups.setdefault(
            (r["data"], r["train_rows"], r["test_rows"], r["steps"], r["posterior"], r["depth"]), []
        ).append(r)
    order = {c: i for i, c in enumerate(CONFIG_ORDER)}
    keys = sorted(
        groups, key=lambda k: (k[0], -k[1], k[3], order.get((k[4], k[5]), 99), k[4], k[5])
    )
    steps_run = sorted({r["steps"] for r in rows}) or [args.steps]
    lines = ["# Deep GPs on MNIST (DSVI's classification experiment)", ""]
    paper_total = (
        sum(PRESWEEP_MS_PER_STEP.get((p, d), float("nan")) for p, d, _ in planned)
        * PAPER_STEPS
        / 1000
    )
    run_total = (
        sum(PRESWEEP_MS_PER_STEP.get((p, d), float("nan")) for p, d, _ in planned)
        * args.steps
        / 1000
    )
    if min(steps_run) < PAPER_STEPS:
        lines += [
            f"**Steps per cell: {', '.join(f'{s:,}' for s in steps_run)}, not the paper's "
            f"{PAPER_STEPS:,}** (DSVI's "
            "schedule for its small and medium data sets, of which MNIST's 60,000 images are one; "
            "the large-data "
            "schedule, 100,000, is for the sets of 500,000 points and more). "
            "At the ms/step timed before the sweep on this 2-core CPU shared with other jobs (load "
            "average 1 to 5; "
            "mean-field depth 1, 2, 3: "
            f"{PRESWEEP_MS_PER_STEP[('mean_field', 1)]}, "
            f"{PRESWEEP_MS_PER_STEP[('mean_field', 2)]}, "
            f"{PRESWEEP_MS_PER_STEP[('mean_field', 3)]}; global depth 2, 3: "
            f"{PRESWEEP_MS_PER_STEP[('global', 2)]}, "
            f"{PRESWEEP_MS_PER_STEP[('global', 3)]}), the {len(planned)} cells would take about "
            f"{_hours(paper_total)} "
            f"({paper_total / 86400:.1f} days) of training at {PAPER_STEPS:,} steps; "
            f"{args.steps:,} steps take about "
            f"{_hours(run_total)}, about a day with the evaluations. The accuracies below are "
            "therefore of shorter "
            f"runs than the paper's ({args.steps * 10_000 // 60_000:,} epochs instead of "
            f"{PAPER_STEPS * 10_000 // 60_000:,}).",
            "",
        ]
    lines += [
        "Protocol: the full MNIST (60,000 training, 10,000 test images), pixels divided by 255 (in "
        "[0, 1]), "
        "784 inputs; `gpflow.likelihoods.MultiClass(10)` (robust-max); `build_deep_gp` with M = "
        "100 and DSVI's "
        "initialisation (mean-field: k-means inducing inputs, inner-layer q(U) at 1e-5 times the "
        "prior's "
        "Cholesky; global inducing: O&A's); Adam 0.01, minibatch 10,000, one sample a step. Test "
        "metrics from the "
        "predictive mixture with the rows' test samples (one layer: exact, the samples do not "
        "matter); ECE with "
        f"{ECE_BINS} equal-width bins. Mean ± standard error over seeds (n), then the per-seed "
        "values "
        "(seed order). ms/step: the median over the cell's segments of steady-state training time, "
        "on the shared "
        "2-core CPU (other jobs ran; compare within this file only).",
        "",
        f"Made by `{recorded_command(argv)}` from the result lines; the sweep's command is in each "
        "line.",
        "",
        "| data | steps | posterior | depth | n | accuracy % | per seed | test LL | per seed | ECE "
        "% | ms/step "
        "| DSVI paper accuracy % (mean-field, this depth) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in keys:
        g = sorted(groups[key], key=lambda r: r["seed"])
        data, n_train, n_test, steps, posterior, depth = key
        acc = mean_se(100 * r["accuracy"] for r in g)
        ll = mean_se(r["test_ll"] for r in g)
        ece = mean_se(100 * r["ece"] for r in g)
        ms = mean_se(r["ms_per_step"] for r in g if r.get("ms_per_step"))
        name = (
            data if (n_train, n_test) == (60_000, 10_000) else f"{data} ({n_train:,} / {n_test:,})"
        )
        lines.append(
            f"| {name} | {steps:,} | {posterior} | {depth} | {acc[2]} | {_fmt(acc[0], acc[1], 2)} "
            "| "
            + ", ".join(f"{100 * r['accuracy']:.2f}" for r in g)
            + f" | {_fmt(ll[0], ll[1], 4)} | "
            + ", ".join(f"{r['test_ll']:.4f}" for r in g)
            + f" | {_fmt(ece[0], ece[1], 2)} | "
            + (f"{ms[0]:.0f}" if ms[2] else "–")
            + f" | {PAPER_ACCURACY.get(depth, '–')} |"
        )
    if not keys:
        lines.append("| (no finished cells yet) | | | | | | | | | | | |")
    finished = {
        (r["posterior"], r["depth"], r["seed"])
        for r in rows
        if r["steps"] == args.steps and r["data"] == args.data_label
    }
    pending = [c for c in planned if c not in finished]
    lines += [
        "",
        f"## Still running / not yet run ({len(pending)} of {len(planned)} cells at {args.steps:,} "
        "steps)",
        "",
    ]
    for posterior, depth, seed in pending:
        mine = [
            t
            for t in trace
            if (t["data"], t["posterior"], t["depth"], t["seed"])
            == (args.data_label, posterior, depth, seed)
        ]
        if mine:
            t = max(mine, key=lambda t: t["step"])
            lines.append(
                f"* {posterior} depth {depth} seed {seed}: started, step {t['step']:,} of "
                f"{args.steps:,} "
                f"reached (test accuracy {100 * t['accuracy']:.2f}% with {t['test_samples']} "
                "samples); "
                "running or interrupted (a rerun of the sweep resumes it)"
            )
        else:
            lines.append(f"* {posterior} depth {depth} seed {seed}: not yet run")
    if not pending:
        lines.append("* none")
    lines += [
        "",
        "Paper: Salimbeni & Deisenroth (2017), *Doubly stochastic variational inference for deep "
        "Gaussian "
        "processes*, NeurIPS: MNIST test accuracy 97.48% (SGP, one layer), 98.06% (DGP 2), 98.11% "
        "(DGP 3), "
        "robust-max likelihood, M = 100, minibatch 10,000, Adam 0.01.",
    ]
    if args.plot:  # finished runs only: a running one's partial trace is listed above instead
        plot(
            [t for t in trace if (t["posterior"], t["depth"], t["seed"]) in finished],
            args.plot,
            args.data_label,
        )
        lines += [
            "",
            "![test accuracy, log-likelihood and ECE against training "
            f"step]({os.path.basename(args.plot)})",
        ]
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    print(text)
    return text


def trace_bands(trace: List[Dict], data: str) -> Dict[tuple, Dict[str, tuple]]:
    """The trace of ``data`` by configuration, seeds pooled: ``(posterior, depth) -> {metric:
    (steps, mean, lowest, highest)}`` for accuracy, test LL and ECE, each over the seeds traced at
    that step (a step traced by one seed only has its value three times)."""
    runs: Dict[tuple, Dict[int, Dict[int, Dict]]] = {}
    for t in trace:
        if t["data"] == data:
            runs.setdefault((t["posterior"], t["depth"]), {}).setdefault(t["step"], {})[
                t["seed"]
            ] = t
    out: Dict[tuple, Dict[str, tuple]] = {}
    for config, by_step in runs.items():
        steps = sorted(by_step)
        out[config] = {}
        for name in ("accuracy", "test_ll", "ece"):
            values = [[t[name] for t in by_step[s].values()] for s in steps]
            out[config][name] = (
                steps,
                [float(np.mean(v)) for v in values],
                [float(min(v)) for v in values],
                [float(max(v)) for v in values],
            )
    return out


def plot(trace: List[Dict], path: str, data: str) -> None:
    """Test accuracy, test LL and ECE against the step from the cells' own traces (from the first
    trained step on): per
    configuration the mean over its seeds as a line (the family's colour, the depth's marker) and
    the lowest to the highest seed as a band (:func:`trace_bands`); the DSVI paper's accuracy at
    each depth as a black reference line in the accuracy panel, one line style per depth, named in
    the legend under the panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks import plot_style

    bands = trace_bands(trace, data)
    seeds = {
        k: len(
            {t["seed"] for t in trace if (t["posterior"], t["depth"]) == k and t["data"] == data}
        )
        for k in bands
    }
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    order = {c: i for i, c in enumerate(CONFIG_ORDER)}
    for config in sorted(bands, key=lambda c: order.get(c, 99)):
        posterior, depth = config
        colour = plot_style.family_colour(posterior)
        for ax, name, scale in zip(axes, ("accuracy", "test_ll", "ece"), (100, 1, 100)):
            # from the first trained step on (the untrained model's point would set the scale)
            steps, mean, low, high = (
                v[1:] if bands[config][name][0][0] == 0 else v for v in bands[config][name]
            )
            ax.plot(
                steps,
                [scale * v for v in mean],
                color=colour,
                marker=plot_style.depth_marker(depth),
                ms=4,
                label=f"{posterior}, depth {depth} ({seeds[config]} seed"
                + ("s" if seeds[config] > 1 else "")
                + ")",
            )
            if seeds[config] > 1:
                ax.fill_between(
                    steps,
                    [scale * v for v in low],
                    [scale * v for v in high],
                    color=colour,
                    alpha=0.2,
                    lw=0,
                )
    # one line style per depth, named in the legend: two of the paper's numbers lie 0.05 points
    # apart, too close for labels beside the lines
    styles = {1: ":", 2: "--", 3: "-."}
    for depth, accuracy in sorted(PAPER_ACCURACY.items()):
        axes[0].axhline(
            accuracy,
            color=plot_style.REFERENCE_COLOUR,
            ls=styles.get(depth, "--"),
            lw=0.9,
            label=f"DSVI paper, depth {depth}: {accuracy}%",
        )
    names = ("test accuracy (%)", "test log-likelihood (nats per image)", "ECE (%)")
    for ax, title in zip(axes, names):
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(title)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    axes[0].set_ylim(95, 99)
    fig.suptitle(
        "each cell's own trace: line = mean over seeds, band = lowest to highest seed; black: the "
        "DSVI paper's accuracy (mean-field, 20,000 steps)",
        fontsize=9,
    )
    fig.tight_layout()
    plot_style.legend_outside(fig, where="below", ncol=3, fontsize=9)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


# ------------------------------------------------------------------------------------------ main


def main(argv: Optional[Sequence[str]] = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sweep", help="train the cells not yet in the results file (resumable)")
    r = sub.add_parser(
        "report", help="write the table of the finished cells and the list of the others"
    )
    for p in (s, r):
        p.add_argument("--posteriors", default="mean_field,global")
        p.add_argument(
            "--depths", default="1,2,3", help="depths to run (global inducing skips depth 1)"
        )
        p.add_argument("--seeds", default="0,1,2")
        p.add_argument("--steps", type=int, default=DEFAULT_STEPS)
        p.add_argument(
            "--trace", default=TRACE, help="the trace file (one JSON line per evaluation)"
        )
    s.add_argument(
        "--data",
        default=None,
        help="an .npz of MNIST's layout (default: what tools/fetch_mnist.py wrote)",
    )
    s.add_argument(
        "--subset", type=int, default=None, help="keep the first N training images (smoke runs)"
    )
    s.add_argument(
        "--test-subset", type=int, default=None, help="keep the first N test images (smoke runs)"
    )
    s.add_argument("--num-inducing", type=int, default=100)
    s.add_argument("--batch-size", type=int, default=10_000)
    s.add_argument("--lr", type=float, default=0.01)
    s.add_argument(
        "--eval-every",
        type=int,
        default=250,
        help="steps between checkpoints and trace evaluations",
    )
    s.add_argument("--log-every", type=int, default=10, help="steps between fit's history entries")
    s.add_argument(
        "--test-samples", type=int, default=100, help="Monte Carlo samples of the final evaluation"
    )
    s.add_argument(
        "--trace-samples", type=int, default=10, help="Monte Carlo samples of the trace evaluations"
    )
    s.add_argument("--eval-chunk", type=int, default=500, help="test images per prediction call")
    s.add_argument("--threads", type=int, default=0, help="TensorFlow threads (0: its default)")
    s.add_argument("--checkpoint-dir", default=CHECKPOINTS)
    add_drop_lost_trace_option(s)
    s.add_argument("--out", default=RESULTS)
    s.add_argument(
        "--in-process",
        action="store_true",
        help="run every cell in this process (default: one process per cell, so memory is "
        "returned)",
    )
    s.add_argument(
        "--command-text", default=None, help=argparse.SUPPRESS
    )  # the command a cell's process records
    r.add_argument("--results", default=RESULTS)
    r.add_argument(
        "--data-label",
        default="mnist",
        help="the data of the 'still running' list ('mnist': the full set)",
    )
    r.add_argument("--out", default=REPORT)
    r.add_argument(
        "--plot",
        default=None,
        help="also write a PNG of the trace (accuracy, test LL, ECE by step)",
    )
    args = parser.parse_args(argv)
    for name in ("steps", "eval_every", "log_every", "num_inducing", "batch_size"):
        if getattr(args, name, 1) is not None and getattr(args, name, 1) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.command == "sweep":
        sweep(args, argv)
    else:
        report(args, argv)


if __name__ == "__main__":
    main()
