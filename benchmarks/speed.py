"""Per-step training time of deepgp_gi's posteriors next to GPflux's DSVI deep GP.

Each configuration times one compiled Adam step (ELBO, gradient, update; one Monte Carlo sample)
of every model, alternating the models round by round so that machine noise hits all alike, and
reports the median milliseconds per step. Results go to ``benchmarks/results/speed.md`` (a table
with the command) and ``benchmarks/results/speed.jsonl`` (one JSON line per configuration and
model, appended as they finish; a rerun with ``--resume`` skips the lines already there).

Run with nothing else heavy on the machine:

    .venv/bin/python benchmarks/speed.py              # all sections
    .venv/bin/python benchmarks/speed.py --quick      # fewer rounds, for a smoke test
    .venv/bin/python benchmarks/speed.py --only mnist --resume   # one section, the others kept

``--only S`` without ``--resume`` replaces section S's lines and keeps the others'. ``--jsonl`` and
``--md`` write elsewhere (a smoke test: ``--only mnist --quick --jsonl /tmp/s.jsonl --md
/tmp/s.md``).

Section ``mnist`` times the training steps of the MNIST benchmarks' models on random data of
MNIST's shape (no download): the deep GPs of ``benchmarks/mnist_dgp.py`` (robust-max likelihood,
M = 100, minibatch 10,000) and the LeNet BNNs of ``benchmarks/images.py``'s MNIST rows (batch 500).
"""

from __future__ import annotations

if not __package__:  # run by path: load benchmarks/ as the package (benchmarks/_by_path.py)
    import _by_path  # noqa: F401  (imported for its side effect)

import argparse
import json
import math
import os
import platform
import re
import shlex
import sys
import time
from typing import List

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import deepgp_gi as dg
from benchmarks import mnist_dgp
from benchmarks.common import append_line, code_commit, read_lines, set_threads
from benchmarks.timing import (
    fit_step,
    gpflux_dsvi,
    kin8nm_inputs,
    model_step,
    ours,
    ours_bnn,
    raise_if_step_failed,
    time_models,
)
from deepgp_gi.families import DEEP_GP_FAMILIES as DEEP_GP_POSTERIORS

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


def sampling_and_latent_families():
    """``(label, family, build options)`` of every deep-GP family ``fit`` trains otherwise than by
    Adam on the ELBO of a plain model: the sampling families of the family table (their
    posterior class has ``is_sampler``) and a latent-variable model (``latent_dim=1``) of every
    family in ``deepgp_gi.latent.LATENT_FAMILIES``, when the package has them."""
    out = [
        (name, name, {})
        for name, family in DEEP_GP_POSTERIORS.items()
        if getattr(family, "is_sampler", False)
    ]
    try:
        from deepgp_gi.latent import LATENT_FAMILIES
    except ImportError:  # a tree without latent-variable models
        LATENT_FAMILIES = ()
    out += [
        (f"latent {name}", name, {"latent_dim": 1})
        for name in LATENT_FAMILIES
        if name in DEEP_GP_POSTERIORS
    ]
    return out


#: The section of the medium sweep's steps (benchmarks/medium.py reads it for the decision
#: table's budgets).
MEDIUM_STEP = "medium_step"
#: The families the medium sweep also runs at depth 5 (the others: depths 2 and 3 only).
MEDIUM_DEPTH_5 = ("mean_field", "global")
#: The section that times a medium-sweep step at the sweep's minibatch against O&A's 10,000 rows.
MEDIUM_MINIBATCH = "medium_minibatch"
#: The minibatches it times: the sweep's, and the papers' (the `medium-*-batch10000` groups).
MEDIUM_BATCHES = (1000, 10000)


def medium_sweep_steps(X, Y, depth):
    """{family: maker} of ``fit``'s step for each family of the medium sweep at ``depth``, as the
    sweep trains it (benchmarks/sweeps/medium.toml: M = 100, one Monte Carlo sample; a
    latent-variable model with one latent dimension on the bound with K = 5 draws). Keys are
    benchmarks/medium.py's family names (``mean_field+w1K5``: latent width 1, K = 5)."""

    def build(name, **o):
        return dg.build_deep_gp(X, Y, depth=depth, posterior=name, num_inducing=100, seed=0, **o)

    makers = {}
    for name in ("mean_field", "global", "stripes_arrow", "sghmc", "bsgp"):
        if name in DEEP_GP_POSTERIORS:
            makers[name] = lambda n=name: fit_step(build(n), X, Y)
    for name in ("mean_field", "global"):
        makers[f"{name}+w1K5"] = lambda n=name: fit_step(
            build(n, latent_dim=1), X, Y, importance_samples=5
        )
    if depth > 3:
        makers = {k: v for k, v in makers.items() if k in MEDIUM_DEPTH_5}
    return makers


#: The section that times the MNIST benchmarks' models (:func:`mnist_sections`).
MNIST = "mnist"
#: MNIST's training images: an epoch is a pass over them.
MNIST_TRAIN_IMAGES = 60_000
#: benchmarks/mnist_dgp.py's minibatch (its ``--batch-size`` default, DSVI's 10,000).
MNIST_DGP_BATCH = 10_000
#: The LeNet BNN families benchmarks/images.py trains on MNIST (the rows of
#: benchmarks/results/images/mnist.jsonl and mnist_long.jsonl; Ensemble-U and Ensemble-W with
#: their default K = 5 members), with the first prior of its sweep, and its batch.
MNIST_BNN_FAMILIES = ("factorised", "global", "ffg_u", "ensemble_u", "ensemble_w")
MNIST_BNN_PRIOR = "neal"
MNIST_BNN_BATCH = 500
#: M of both benchmarks: inducing points of a deep-GP layer, inducing images of a global BNN,
#: the size of FFG-U's inducing weights.
MNIST_NUM_INDUCING = 100


def mnist_inputs(num_rows: int, seed: int = 0):
    """Random data of MNIST's shape: images ``[num_rows, 28, 28, 1]`` with pixels uniform in
    [0, 1] (``load_mnist``'s scale) and labels 0..9 drawn uniformly, as float ``[num_rows, 1]``."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(num_rows, 28, 28, 1))
    Y = rng.integers(0, 10, size=(num_rows, 1)).astype(np.float64)
    return X, Y


def mnist_sections(dgp_batch=None, bnn_batch=None, num_inducing=None, seed: int = 0):
    """The two configurations of section :data:`MNIST` (``None``: the module's constants, read
    when called), each ``(section, config, {model name: maker})`` with ``fit``'s step
    (:func:`fit_step`) of every model on random MNIST-shaped data (:func:`mnist_inputs`):

    * the deep GPs of benchmarks/mnist_dgp.py, built by its ``build`` (784 inputs in [0, 1],
      ``MultiClass(10)``, ``build_deep_gp``'s initialisation) at its depths per family
      (``mnist_dgp.DEPTHS``), named ``family-depth``, at its minibatch;
    * the LeNet BNNs of benchmarks/images.py's MNIST rows, built as its ``run_cell`` builds them
      (inputs standardised by ``standardise_images``, ``build_conv_bnn`` with the LeNet
      architecture), named by family.

    Each model is built on the minibatch it is timed on (its ``num_data`` is the minibatch, which
    changes no cost)."""
    dgp_batch = dgp_batch or MNIST_DGP_BATCH
    bnn_batch = bnn_batch or MNIST_BNN_BATCH
    M = num_inducing or MNIST_NUM_INDUCING
    X, Y = mnist_inputs(dgp_batch, seed)
    X = X.reshape(dgp_batch, -1)
    dgps = {
        f"{family}-{depth}": (
            lambda f=family, d=depth: fit_step(mnist_dgp.build(X, Y, f, d, seed, M), X, Y)
        )
        for family, depths in mnist_dgp.DEPTHS.items()
        for depth in depths
    }
    images, labels = mnist_inputs(bnn_batch, seed)
    images, _ = dg.datasets.standardise_images(images, images[:1])
    bnns = {
        family: (
            lambda f=family: fit_step(
                dg.build_conv_bnn(
                    images,
                    labels,
                    architecture="lenet",
                    posterior=f,
                    prior=MNIST_BNN_PRIOR,
                    num_inducing=M,
                    seed=seed,
                ),
                images,
                labels,
            )
        )
        for family in MNIST_BNN_FAMILIES
    }
    return [
        (MNIST, dict(model="deep GP", batch=dgp_batch, M=M), dgps),
        (MNIST, dict(model="LeNet BNN", prior=MNIST_BNN_PRIOR, batch=bnn_batch, M=M), bnns),
    ]


def paired_ratio(make_a, make_b, rounds: int, steps_per_round: int) -> dict:
    """Step time of B against A, timed in pairs: each round times ``steps_per_round`` steps of one
    right after the other (A first in even rounds, B first in odd ones). Returns the median ms of
    each, the ratio of the medians, and the median and quartiles of the per-round ratios B / A,
    which follow the load of the moment less than the medians do."""
    steps = {"a": make_a(), "b": make_b()}
    for step in steps.values():
        for _ in range(3):
            step()
    times = {"a": [], "b": []}
    for r in range(rounds):
        for name in ("a", "b") if r % 2 == 0 else ("b", "a"):
            t0 = time.perf_counter()
            for _ in range(steps_per_round):
                loss = steps[name]()
            loss.numpy()
            times[name].append((time.perf_counter() - t0) / steps_per_round * 1e3)
    for step in steps.values():
        raise_if_step_failed(step)
    ratios = np.array(times["b"]) / np.array(times["a"])
    return dict(
        median_ms_a=float(np.median(times["a"])),
        median_ms_b=float(np.median(times["b"])),
        ratio_of_medians=float(np.median(times["b"]) / np.median(times["a"])),
        median_paired_ratio=float(np.median(ratios)),
        paired_ratio_quartiles=[float(np.percentile(ratios, 25)), float(np.percentile(ratios, 75))],
    )


def star_pairs(specs: str, rounds: int, steps_per_round: int) -> List[dict]:
    """``--star-pairs batch:M:inner_width,...``: STAR against mean-field at depth 3 by
    :func:`paired_ratio`, one JSON line per configuration (printed and returned)."""
    out = []
    for spec in specs.split(","):
        batch, M, width = (int(x) for x in spec.split(":"))
        X, Y = kin8nm_inputs(batch)
        result = paired_ratio(
            lambda: ours(X, Y, 3, "mean_field", M, inner_width=width),
            lambda: ours(X, Y, 3, "stripes_arrow", M, inner_width=width),
            rounds,
            steps_per_round,
        )
        line = dict(
            pair="stripes_arrow / mean_field",
            batch=batch,
            depth=3,
            M=M,
            inner_width=width,
            rounds=rounds,
            steps_per_round=steps_per_round,
            load_average=os.getloadavg()[0],
            **result,
        )
        print(json.dumps(line), flush=True)
        out.append(line)
    return out


def xla_pairs(families: str, rounds: int, steps_per_round: int) -> None:
    """``--xla-pairs family,...`` (``bnn:name`` for a 2 x 50 BNN): each family's ``fit`` step plain
    and with XLA at depth 3, M = 100, batch 1000, alternated by :func:`time_models`; one JSON line
    per family."""
    X, Y = kin8nm_inputs(1000)
    for family in families.split(","):
        if family.startswith("bnn:"):

            def build(f=family[4:]):
                return dg.build_bnn(X, Y, hidden=(50, 50), posterior=f, num_inducing=100, seed=0)
        else:

            def build(f=family):
                return dg.build_deep_gp(X, Y, depth=3, posterior=f, num_inducing=100, seed=0)

        r = time_models(
            {
                "plain": lambda: fit_step(build(), X, Y, False),
                "xla": lambda: fit_step(build(), X, Y, True),
            },
            rounds,
            steps_per_round,
        )
        print(
            json.dumps(
                dict(
                    family=family,
                    depth=3,
                    M=100,
                    batch=1000,
                    rounds=rounds,
                    steps_per_round=steps_per_round,
                    ms=r,
                    ratio=r["xla"] / r["plain"],
                )
            ),
            flush=True,
        )


def count_ops(depth: int = 3, M: int = 100, batch: int = 1000) -> None:
    """``--count-ops``: executed ops per step (``benchmarks/gpu.py``'s profiler count) of GPflux's
    DSVI step and of every deep-GP family's benchmark step (:func:`model_step`; none for a sampling
    family, which has no ELBO) and ``fit`` step (:func:`fit_step`); one JSON line per model."""
    from benchmarks.gpu import executed_ops_per_step, heavy_counts

    X, Y = kin8nm_inputs(batch)
    print(
        json.dumps(
            dict(
                model="gpflux DSVI",
                benchmark_step=executed_ops_per_step(gpflux_dsvi(X, Y, depth, M), 2).total,
            )
        ),
        flush=True,
    )
    for name, family in DEEP_GP_POSTERIORS.items():

        def build(n=name):
            return dg.build_deep_gp(X, Y, depth=depth, posterior=n, num_inducing=M, seed=0)

        sampler = getattr(family, "is_sampler", False)
        bench = None if sampler else executed_ops_per_step(model_step(build(), X, Y), 2).total
        fit = executed_ops_per_step(fit_step(build(), X, Y), 2)
        print(
            json.dumps(
                dict(
                    model=name,
                    depth=depth,
                    M=M,
                    batch=batch,
                    benchmark_step=bench,
                    fit_step=fit.total,
                    heavy=heavy_counts(fit.by_type),
                )
            ),
            flush=True,
        )


def sections(quick: bool):
    """(section, config, {model name: maker}) for every configuration."""
    out = []
    for batch in (1000, 10000):
        for depth in (1, 2, 3, 5):
            X, Y = kin8nm_inputs(batch)
            makers = {
                "deepgp_gi mean_field (whiten=False)": lambda X=X, Y=Y, d=depth: ours(
                    X, Y, d, "mean_field", 100
                ),
                "deepgp_gi mean_field (whiten=True)": lambda X=X, Y=Y, d=depth: ours(
                    X, Y, d, "mean_field", 100, whiten=True
                ),
                "gpflux DSVI (whiten=True)": lambda X=X, Y=Y, d=depth: gpflux_dsvi(X, Y, d, 100),
            }
            for name in ("global", "local"):
                if name in DEEP_GP_POSTERIORS and batch == 1000 and depth >= 2:
                    makers[f"deepgp_gi {name}"] = lambda X=X, Y=Y, d=depth, n=name: ours(
                        X, Y, d, n, 100
                    )
            out.append(("dsvi", dict(batch=batch, depth=depth, M=100), makers))
    if "stripes_arrow" in DEEP_GP_POSTERIORS:
        X, Y = kin8nm_inputs(1000)
        makers = {
            f"deepgp_gi {name}": (lambda n=name: ours(X, Y, 3, n, 100))
            for name in ("mean_field", "stripes_arrow")
        }
        makers["gpflux DSVI (whiten=True)"] = lambda: gpflux_dsvi(X, Y, 3, 100)
        out.append(("star", dict(batch=1000, depth=3, M=100), makers))
        X, Y = kin8nm_inputs(512)
        for M in (32, 64, 128, 256):
            makers = {
                f"deepgp_gi {name}": (lambda n=name, M=M: ours(X, Y, 3, n, M, inner_width=5))
                for name in ("mean_field", "stripes_arrow", "fully_coupled")
            }
            out.append(("structured", dict(batch=512, depth=3, M=M, inner_width=5), makers))
    for batch in (1000, 10000):
        X, Y = kin8nm_inputs(batch)

        def build(name, X=X, Y=Y, **o):
            return dg.build_deep_gp(X, Y, depth=3, posterior=name, num_inducing=100, seed=0, **o)

        makers = {"mean_field": lambda X=X, Y=Y: fit_step(build("mean_field"), X, Y)}
        for label, name, options in sampling_and_latent_families():
            if (
                batch > 1000 and options and name != "mean_field"
            ):  # latent models of the costlier families: batch 1000
                continue
            if (
                options and name != "mean_field" and name not in makers
            ):  # the plain family beside its latent model
                makers[name] = lambda X=X, Y=Y, n=name: fit_step(build(n), X, Y)
            makers[label] = lambda X=X, Y=Y, n=name, o=options: fit_step(build(n, **o), X, Y)
            if options and name in (
                "mean_field",
                "global",
            ):  # the bound the UCI benchmarks train (K = 5)
                makers[f"{label} K=5"] = lambda X=X, Y=Y, n=name, o=options: fit_step(
                    build(n, **o), X, Y, importance_samples=5
                )
                # its peer: the plain ELBO propagating as many draws per point (five Monte
                # Carlo samples)
                makers[f"{name} S=5"] = lambda X=X, Y=Y, n=name: fit_step(
                    build(n), X, Y, num_samples=5
                )
        if len(makers) > 1:
            out.append(("sampling", dict(batch=batch, depth=3, M=100), makers))
    X, Y = kin8nm_inputs(1000)
    for depth in (2, 3, 5):
        out.append(
            (MEDIUM_STEP, dict(batch=1000, depth=depth, M=100), medium_sweep_steps(X, Y, depth))
        )
    inputs = {batch: kin8nm_inputs(batch) for batch in MEDIUM_BATCHES}
    for family in (
        "mean_field",
        "global",
    ):  # the steps of the medium-*-batch10000 groups and their peers
        makers = {
            f"batch {batch}": (
                lambda XY=inputs[batch], f=family: fit_step(
                    dg.build_deep_gp(*XY, depth=2, posterior=f, num_inducing=100, seed=0), *XY
                )
            )
            for batch in MEDIUM_BATCHES
        }
        out.append((MEDIUM_MINIBATCH, dict(family=family, depth=2, M=100), makers))
    makers = {
        f"deepgp_gi bnn {p}": (lambda p=p: ours_bnn(X, Y, p, 100))
        for p in ("factorised", "global", "factorised_global")
    }
    out.append(("bnn", dict(batch=1000, hidden=[50, 50], M=100), makers))
    for family in DEEP_GP_POSTERIORS:  # every deep-GP family of the table, with fit's own step
        M = 32 if family == "fully_coupled" else 50
        makers = {
            mode: (
                lambda f=family, M=M, jit=(mode == "xla"): fit_step(
                    dg.build_deep_gp(
                        X, Y, depth=2, posterior=f, num_inducing=M, inner_width=4, seed=0
                    ),
                    X,
                    Y,
                    jit,
                )
            )
            for mode in ("plain", "xla")
        }
        out.append(
            (
                "xla",
                dict(kind="deep GP", family=family, batch=1000, depth=2, M=M, inner_width=4),
                makers,
            )
        )
    for family in ("factorised", "local", "global", "factorised_global"):
        makers = {
            mode: (
                lambda f=family, jit=(mode == "xla"): fit_step(
                    dg.build_bnn(X, Y, hidden=(50, 50), posterior=f, num_inducing=100, seed=0),
                    X,
                    Y,
                    jit,
                )
            )
            for mode in ("plain", "xla")
        }
        out.append(("xla", dict(kind="BNN 2x50", family=family, batch=1000, M=100), makers))
    out += mnist_sections()
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="3 rounds of 3 steps (smoke test)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps-per-round", type=int, default=10)
    parser.add_argument(
        "--only",
        default=None,
        help=f"run only this section (dsvi, star, structured, sampling, {MEDIUM_STEP}, "
        f"{MEDIUM_MINIBATCH}, bnn, xla, {MNIST}); without --resume its lines replace that "
        "section's previous ones, the other sections' lines kept",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="TensorFlow intra- and inter-op threads (default: TF's; the medium sweep runs with 1)",
    )
    parser.add_argument(
        "--resume", action="store_true", help="skip configurations already in speed.jsonl"
    )
    parser.add_argument(
        "--star-pairs",
        default=None,
        metavar="BATCH:M:WIDTH,...",
        help="only time STAR against mean-field in paired rounds (section star_pairs of "
        "speed.jsonl, replacing the previous run's)",
    )
    parser.add_argument(
        "--count-ops",
        action="store_true",
        help="only count executed ops per step (depth 3, M = 100, batch 1000; printed)",
    )
    parser.add_argument(
        "--xla-pairs",
        default=None,
        metavar="FAMILY,...",
        help="only time these families' fit steps plain against XLA, depth 3 (printed)",
    )
    parser.add_argument(
        "--report-only", action="store_true", help="only rewrite speed.md from speed.jsonl"
    )
    parser.add_argument(
        "--jsonl",
        default=None,
        help="the JSON lines file (default: benchmarks/results/speed.jsonl)",
    )
    parser.add_argument(
        "--md", default=None, help="the report (default: benchmarks/results/speed.md)"
    )
    args = parser.parse_args(argv)
    rounds, per = (3, 3) if args.quick else (args.rounds, args.steps_per_round)
    jsonl = args.jsonl or os.path.join(RESULTS, "speed.jsonl")
    md = args.md or os.path.join(RESULTS, "speed.md")
    for path in (jsonl, md):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if args.report_only:
        print(write_markdown(read_lines(jsonl), md))
        return
    set_threads(args.threads)
    command = "python benchmarks/speed.py " + " ".join(
        shlex.quote(a) for a in (argv or sys.argv[1:])
    )
    commit = code_commit()
    if args.star_pairs or args.xla_pairs or args.count_ops:
        if args.count_ops:
            count_ops()
        if args.star_pairs:
            pairs = star_pairs(args.star_pairs, rounds, per)
            kept = []
            if os.path.exists(jsonl):
                with open(jsonl) as fh:
                    kept = [l for l in fh if l.strip() and json.loads(l)["section"] != "star_pairs"]
            with open(jsonl, "w") as fh:
                fh.writelines(kept)
                for pair in pairs:
                    config = {k: pair[k] for k in ("batch", "depth", "M", "inner_width")}
                    fh.write(
                        json.dumps(
                            dict(
                                section="star_pairs",
                                config=config,
                                result=pair,
                                rounds=rounds,
                                steps_per_round=per,
                                commit=commit,
                                command=command,
                                machine=f"{platform.machine()} {os.cpu_count()} cores",
                                tensorflow=tf.__version__,
                                load_average=pair["load_average"],
                            )
                        )
                        + "\n"
                    )
            print(write_markdown(read_lines(jsonl), md))
        if args.xla_pairs:
            xla_pairs(args.xla_pairs, rounds, per)
        return
    done = set()
    if args.resume:
        done = {json.dumps([l["section"], l["config"]], sort_keys=True) for l in read_lines(jsonl)}
    elif args.only and os.path.exists(jsonl):  # this section's lines go, the others stay as written
        with open(jsonl) as fh:
            kept = [l.rstrip("\n") + "\n" for l in fh if l.strip() and _section_of(l) != args.only]
        with open(jsonl, "w") as fh:
            fh.writelines(kept)
    elif os.path.exists(jsonl):
        os.remove(jsonl)
    for section, config, makers in sections(args.quick):
        if args.only and section != args.only:
            continue
        key = json.dumps([section, config], sort_keys=True)
        if key in done:
            continue
        result = time_models(makers, rounds, per)
        line = dict(
            section=section,
            config=config,
            ms_per_step=result,
            rounds=rounds,
            steps_per_round=per,
            commit=commit,
            command=command,
            machine=f"{platform.machine()} {os.cpu_count()} cores",
            tensorflow=tf.__version__,
            load_average=os.getloadavg()[0],
            threads=tf.config.threading.get_intra_op_parallelism_threads() or None,
        )
        print(json.dumps(line), flush=True)
        append_line(jsonl, line)
    print(write_markdown(read_lines(jsonl), md))


def _section_of(text: str):
    """The section of one line of speed.jsonl; None for a line that does not parse (the truncated
    last line of a killed run)."""
    try:
        return json.loads(text)["section"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return None


def _cores(lines) -> str:
    """The core count of the machine the lines name (``"x86_64 2 cores"``), "?" where none says."""
    counts = sorted(
        {m.group(1) for l in lines if (m := re.search(r"(\d+) cores", l.get("machine", "")))},
        key=int,
    )
    return " or ".join(counts) or "?"


def _provenance(lines):
    text = (
        f"Command: `{lines[0]['command']}` (commit {lines[0]['commit']}, {lines[0]['rounds']} "
        f"rounds x {lines[0]['steps_per_round']} steps)."
    )
    loads = [l["load_average"] for l in lines if "load_average" in l]
    if loads:  # the 1-minute load average as each configuration finished (os.getloadavg)
        text += (
            f" Load average as the configurations finished: {min(loads):.1f} to {max(loads):.1f} "
            f"on {_cores(lines)} cores."
        )
    return text


def _threads_label(threads) -> str:
    """A section heading's TensorFlow threads, from the set of its lines' ``threads`` fields."""
    if threads == {1}:
        return "one TensorFlow thread"
    if threads == {None}:  # no --threads: TensorFlow chose
        return "TensorFlow's default threads"
    return "threads " + ", ".join(map(str, sorted(threads, key=str)))


def write_markdown(lines: List[dict], path: str) -> str:
    """The report of the speed lines ``lines`` (one section per benchmark section), written to
    ``path`` and returned. Machine and TensorFlow version are those the lines record."""
    versions = (
        ", ".join(sorted({l["tensorflow"] for l in lines if "tensorflow" in l})) or tf.__version__
    )
    md = [
        "# Training-step speed",
        "",
        f"Machine: {lines[0]['machine'] if lines else ''}, TensorFlow {versions}. "
        "Each section names the command and commit that produced it.",
        "",
        "Median ms per compiled Adam step (ELBO + gradient + update, 1 Monte Carlo sample, "
        "float64), models alternated round by round in one process.",
        "",
        "A section that gives a load average was timed under that load (the 1-minute average as "
        "each configuration finished, `os.getloadavg`): on a loaded machine each step takes "
        "longer and only the ratios between the models of one configuration mean anything, and "
        "those scatter between runs.",
        "",
    ]
    dsvi = [l for l in lines if l["section"] == "dsvi"]
    if dsvi:
        names = list(dict.fromkeys(n for l in dsvi for n in l["ms_per_step"]))
        md += [
            "## Mean-field DSVI vs GPflux (kin8nm inputs, M = 100, inner width 8)",
            "",
            _provenance(dsvi),
            "",
            "| batch | depth | "
            + " | ".join(names)
            + " | ours/GPflux (whiten=False) | ours/GPflux (whiten=True) |",
            "|---|---|" + "---|" * (len(names) + 2),
        ]
        for l in dsvi:
            t = l["ms_per_step"]
            ref = t["gpflux DSVI (whiten=True)"]
            md.append(
                f"| {l['config']['batch']} | {l['config']['depth']} | "
                + " | ".join(f"{t.get(n, float('nan')):.1f}" for n in names)
                + (
                    f" | {t['deepgp_gi mean_field (whiten=False)'] / ref:.2f} | "
                    f"{t['deepgp_gi mean_field (whiten=True)'] / ref:.2f} |"
                )
            )
        md.append("")
    pairs = [l for l in lines if l["section"] == "star_pairs"]
    if pairs:
        md += [
            "## STAR against mean-field in paired rounds (kin8nm inputs, depth 3)",
            "",
            _provenance(pairs),
            "",
            "Each round times a few steps of one model right after the other (the order "
            "alternating), so the per-round ratio follows the load of the moment less than the "
            "medians do. The first row is the configuration of the target (M = 100, batch 1,000, "
            "inner width 8); the others are Lindinger et al.'s runtime study (batch 512, 5 GPs "
            "per hidden layer).",
            "",
            "| batch | M | inner width | mean_field ms | stripes_arrow ms | ratio of medians | "
            "median paired ratio | quartiles |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for l in pairs:
            r = l["result"]
            md.append(
                f"| {r['batch']} | {r['M']} | {r['inner_width']} | {r['median_ms_a']:.1f} | "
                f"{r['median_ms_b']:.1f} | {r['ratio_of_medians']:.2f} | "
                f"{r['median_paired_ratio']:.2f} | {r['paired_ratio_quartiles'][0]:.2f} to "
                f"{r['paired_ratio_quartiles'][1]:.2f} |"
            )
        md.append("")
    star = [l for l in lines if l["section"] == "star"]
    if star:
        t = star[0]["ms_per_step"]
        md += [
            "## STAR against mean-field and GPflux (kin8nm inputs, depth 3, M = 100, inner width "
            "8, batch 1000)",
            "",
            _provenance(star),
            "",
            "| " + " | ".join(t) + " | STAR / mean-field | mean-field / GPflux |",
            "|" + "---|" * (len(t) + 2),
            "| "
            + " | ".join(f"{v:.1f}" for v in t.values())
            + f" | {t['deepgp_gi stripes_arrow'] / t['deepgp_gi mean_field']:.2f}"
            + f" | {t['deepgp_gi mean_field'] / t['gpflux DSVI (whiten=True)']:.2f} |",
            "",
        ]
    structured = [l for l in lines if l["section"] == "structured"]
    if structured:
        names = list(structured[0]["ms_per_step"])
        md += [
            "## Lindinger's runtime study (3 layers, 5 GPs per hidden layer, batch 512)",
            "",
            _provenance(structured),
            "",
            "| M | " + " | ".join(names) + " | STAR / mean-field |",
            "|---|" + "---|" * (len(names) + 1),
        ]
        for l in structured:
            t = l["ms_per_step"]
            md.append(
                f"| {l['config']['M']} | "
                + " | ".join(f"{t[n]:.1f}" for n in names)
                + f" | {t['deepgp_gi stripes_arrow'] / t['deepgp_gi mean_field']:.2f} |"
            )
        Ms = np.log([l["config"]["M"] for l in structured])
        md += [
            "",
            "Fitted slope of log time against log M: "
            + ", ".join(
                f"{n}: "
                f"{np.polyfit(Ms, np.log([l['ms_per_step'][n] for l in structured]), 1)[0]:.2f}"
                for n in names
            ),
            "",
        ]
    sampling = [l for l in lines if l["section"] == "sampling"]
    if sampling:
        names = list(dict.fromkeys(n for l in sampling for n in l["ms_per_step"]))
        md += [
            "## Sampling and latent-variable families against mean-field (fit's own steps; depth "
            "3, M = 100)",
            "",
            _provenance(sampling),
            "",
            "Each model is timed with the step `fit` trains it with (`TrainStep`, or "
            "`SamplerStep` for a sampling family: an SGHMC move of the chain and an Adam step on "
            "the hyperparameters); the ratio is to mean-field's `TrainStep` in the same run; a "
            "latent-variable model (`latent X`, one latent dimension, the ELBO with one draw of w "
            "per point unless `K=5` says five) is also given against its plain family `X` timed "
            "beside it, and the K = 5 bound against mean-field's ELBO with five Monte Carlo "
            "samples (`mean_field S=5`): both propagate five draws per data point through the "
            "layers.",
            "",
            "| batch | "
            + " | ".join(names)
            + " | "
            + " | ".join(f"{n} / mean_field" for n in names[1:])
            + " |",
            "|---|" + "---|" * (2 * len(names) - 1),
        ]
        for l in sampling:
            t = l["ms_per_step"]
            md.append(
                f"| {l['config']['batch']} | "
                + " | ".join(f"{t.get(n, float('nan')):.1f}" for n in names)
                + " | "
                + " | ".join(f"{t.get(n, float('nan')) / t['mean_field']:.2f}" for n in names[1:])
                + " |"
            )
        # a latent model against its plain family; the K = 5 bound against the plain ELBO with as
        # many draws per point (S = 5) when that was timed
        pairs = [(n, n[len("latent ") :].split(" ")[0]) for n in names if n.startswith("latent ")]
        pairs = [
            (n, f"{p} S=5" if n.endswith(" K=5") and f"{p} S=5" in names else p) for n, p in pairs
        ]
        if any(plain in names for _, plain in pairs):
            md += [
                "",
                "| batch | " + " | ".join(f"{n} / {p}" for n, p in pairs) + " |",
                "|---|" + "---|" * len(pairs),
            ]
            for l in sampling:
                t = l["ms_per_step"]
                md.append(
                    f"| {l['config']['batch']} | "
                    + " | ".join(
                        f"{t.get(n, float('nan')) / t.get(p, float('nan')):.2f}" for n, p in pairs
                    )
                    + " |"
                )
        md.append("")
    medium = [l for l in lines if l["section"] == MEDIUM_STEP]
    if medium:
        names = list(dict.fromkeys(n for l in medium for n in l["ms_per_step"]))
        threads = {l.get("threads") for l in medium}
        md += [
            f"## The medium sweep's steps (kin8nm inputs, batch 1000, M = 100, "
            f"{_threads_label(threads)})",
            "",
            _provenance(medium),
            "",
            "Each family of `benchmarks/sweeps/medium.toml` timed with the step `fit` trains it "
            "with, at the sweep's settings; `X+w1K5` is the latent-variable model (one latent "
            "dimension) on the bound with K = 5 draws per point. `benchmarks/medium.py report` "
            "turns these into the decision table's training times (ms per step times the steps a "
            "row ran, plus a sampling family's collection steps).",
            "",
            "| depth | " + " | ".join(names) + " |",
            "|---|" + "---|" * len(names),
        ]
        for l in medium:
            t = l["ms_per_step"]
            md.append(
                f"| {l['config']['depth']} | "
                + " | ".join(f"{t[n]:.1f}" if n in t else "—" for n in names)
                + " |"
            )
        md.append("")
    minibatch = [l for l in lines if l["section"] == MEDIUM_MINIBATCH]
    if minibatch:
        threads = {l.get("threads") for l in minibatch}
        small, large = (f"batch {b}" for b in MEDIUM_BATCHES)
        md += [
            f"## The medium sweep's step at minibatch {MEDIUM_BATCHES[0]:,} and "
            f"{MEDIUM_BATCHES[1]:,} (kin8nm inputs, depth 2, M = 100, "
            f"{_threads_label(threads)})",
            "",
            _provenance(minibatch),
            "",
            "The step `fit` trains each family with, at the sweep's minibatch and at the papers' "
            "(the `medium-*-batch10000` groups of `benchmarks/sweeps/medium.toml`), the two "
            "alternated round by round. The last column is the price of a pass over the data at "
            "the larger minibatch against the smaller one: ten steps at 1,000 rows read as many "
            "rows as one at 10,000.",
            "",
            f"| family | {small} | {large} | {large} / {small} | "
            f"one pass at {MEDIUM_BATCHES[1]:,} / at {MEDIUM_BATCHES[0]:,} |",
            "|---|---|---|---|---|",
        ]
        ratio = MEDIUM_BATCHES[1] // MEDIUM_BATCHES[0]
        for l in minibatch:
            t = l["ms_per_step"]
            md.append(
                f"| {l['config']['family']}-{l['config']['depth']} | {t[small]:.1f} | "
                f"{t[large]:.1f} | {t[large] / t[small]:.1f} | "
                f"{t[large] / (ratio * t[small]):.2f} |"
            )
        md.append("")
    bnn = [l for l in lines if l["section"] == "bnn"]
    if bnn:
        t = bnn[0]["ms_per_step"]
        md += [
            "## BNN 2 x 50 ReLU (kin8nm inputs, batch 1000, M = 100)",
            "",
            _provenance(bnn),
            "",
            "| " + " | ".join(t) + " |",
            "|" + "---|" * len(t),
            "| " + " | ".join(f"{v:.1f}" for v in t.values()) + " |",
            "",
        ]
    xla = [l for l in lines if l["section"] == "xla"]
    if xla:
        md += [
            "## Plain against XLA (`jit_compile=True`), CPU (kin8nm inputs, batch 1000)",
            "",
            _provenance(xla),
            "",
            "Each family's `fit` step (`TrainStep`, or `SamplerStep` for a sampling family), "
            "compiled plainly "
            'and with XLA; `fit(jit_compile="auto")` compiles with XLA only the families in '
            "`deepgp_gi.training.compilation.XLA_FASTER`, entered from repeated measurements "
            "(docs/performance.md).",
            "",
            "| model | family | M | plain | XLA | XLA / plain |",
            "|---|---|---|---|---|---|",
        ]
        for l in xla:
            t, c = l["ms_per_step"], l["config"]
            md.append(
                f"| {c['kind']} | {c['family']} | {c['M']} | {t['plain']:.1f} | {t['xla']:.1f} | "
                f"{t['xla'] / t['plain']:.2f} |"
            )
        md.append("")
    mnist = [l for l in lines if l["section"] == MNIST]
    if mnist:
        md += [
            f"## MNIST: the image benchmarks' training steps (random MNIST-shaped data, "
            f"{_threads_label({l.get('threads') for l in mnist})})",
            "",
            _provenance(mnist),
            "",
            "Each model timed with the step `fit` trains it with, on random data of MNIST's shape "
            "(28 x 28 pixels uniform in [0, 1], labels 0..9 drawn uniformly, seed 0): the deep GPs "
            "as `benchmarks/mnist_dgp.py` builds them (784 inputs, `MultiClass(10)` robust-max "
            "likelihood, inner width 30) and the LeNet BNNs of `benchmarks/images.py`'s MNIST rows "
            "(inputs standardised, `build_conv_bnn` with the LeNet architecture; M is the number "
            "of global inducing images, or the size of FFG-U's and Ensemble-U's inducing weights; "
            "the ensembles have K = 5 members and train one a step). The models of "
            "one kind (the deep GPs, the BNNs) alternate round by round. An epoch is a pass over "
            "MNIST's "
            f"{MNIST_TRAIN_IMAGES:,} training images: steps per epoch = {MNIST_TRAIN_IMAGES:,} / "
            "batch (rounded up); seconds per epoch = that times ms per step (the compiled step "
            "only: fit's slicing of the minibatches and its logging are not counted).",
            "",
            "| model | family | depth | batch | M | ms per step (median) | steps per epoch | "
            "s per epoch |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for l in mnist:
            c = l["config"]
            steps = math.ceil(MNIST_TRAIN_IMAGES / c["batch"])
            for name, ms in l["ms_per_step"].items():
                if c["model"] == "deep GP":
                    family, depth = name.rsplit("-", 1)
                else:
                    family, depth = name, "LeNet"
                model = c["model"] + (f" ({c['prior']} prior)" if "prior" in c else "")
                md.append(
                    f"| {model} | {family} | {depth} | {c['batch']:,} | {c['M']} | {ms:.1f} | "
                    f"{steps:,} | {steps * ms / 1e3:.1f} |"
                )
        md.append("")
    text = "\n".join(md) + "\n"
    with open(path, "w") as fh:
        fh.write(text)
    return text


if __name__ == "__main__":
    main()
