"""Convolutional BNNs on images: factorised vs global inducing vs fac->gi, Neal vs SpatialIW.

Every (posterior, prior, seed) cell trains ``build_conv_bnn`` and appends one JSON line: test
accuracy, test log-likelihood, expected calibration error (15 bins), predictive entropy, the
ELBO per training image, and milliseconds per step. A cell already in the results file is
skipped, and a cell whose run is interrupted resumes from its checkpoint, so the sweep can be
stopped and restarted at will. ``report`` writes the table (mean +- standard error over seeds).

Digits (default; bundled, 1,500 train / 297 test 8x8 images):

    python benchmarks/images.py sweep --out benchmarks/results/images/digits.jsonl
    python benchmarks/images.py report --results benchmarks/results/images/digits.jsonl \
        --out benchmarks/results/images/digits.md

MNIST / CIFAR-10 with the paper's settings (O&A 2021 App. O: ResNet, M = 500, batch 500, Adam
1e-2, KL tempering, 1 training / 10 test samples) for a machine with a GPU and the files:

    python benchmarks/images.py sweep --dataset cifar10 --path ~/data/cifar-10-batches-py --paper \
        --out results/cifar10.jsonl

Inducing weights (Ritter et al. 2021; every conv and dense layer, ``--num-inducing`` is M) on
the digits, written to their own file with the FFG-W (factorised) reference:

    nice -n 19 python benchmarks/images.py sweep \
        --posteriors ffg_u,ensemble_u,factorised,ensemble_w --priors neal --seeds 0 \
        --num-inducing 16 --out benchmarks/results/images/digits_inducing_weights.jsonl

Every row records the number of variational parameters (``dg.parameter_count``).

Inputs are standardised with the training images' mean and standard deviation (one number each).
"""

from __future__ import annotations

if not __package__:  # run by path: load benchmarks/ as the package (benchmarks/_by_path.py)
    import _by_path  # noqa: F401  (imported for its side effect)

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

import deepgp_gi as dg
from benchmarks.common import append_line, mean_se, read_lines
from deepgp_gi import metrics

POSTERIORS = ("factorised", "global", "factorised_global")
#: Ritter et al.'s inducing-weight families on the same conv nets (``--num-inducing`` is M).
INDUCING_WEIGHTS = ("ffg_u", "ensemble_u", "ensemble_w")
PRIORS = ("neal", "spatial_iw")


def load(dataset: str, path, split: int):
    if dataset == "digits":
        return dg.datasets.load_digits(split)
    if dataset == "mnist":
        return dg.datasets.load_mnist(path)  # path None: the arrays tools/fetch_mnist.py wrote
    if dataset == "cifar10":
        return dg.datasets.load_cifar10(path)
    raise ValueError(f"unknown dataset {dataset!r}")


def evaluate(model, X, Y, num_samples: int) -> dict:
    probs = metrics.predict_class_probabilities(model, X, num_samples, chunk_size=500)
    # log p(y | x) = log mean_s softmax(f_s)[y], the label's entry of the same predictive
    # probabilities (predict_log_density's estimator, without a second pass over the test images)
    labels = np.asarray(Y[:, 0], dtype=np.int64)
    lpd = np.log(np.maximum(probs[np.arange(len(labels)), labels], np.finfo(np.float64).tiny))
    return {
        "accuracy": metrics.top1_accuracy(probs, Y),
        "test_ll": float(np.mean(lpd)),
        "ece": metrics.expected_calibration_error(probs, Y, num_bins=15),
        "entropy": float(np.mean(metrics.categorical_entropy(probs))),
    }


def elbo_per_image(model, X, Y, num_samples: int, chunk: int = 500) -> float:
    """The full-data ELBO / N: the expected log-likelihood summed over chunks (each chunk's
    ``elbo_terms`` is rescaled to the full data, so it is weighted by its share) minus the KL,
    averaged over ``num_samples`` samples per chunk. ``X`` may be the first rows of the training
    set only (``--elbo-rows``): the rescaled expected log-likelihood is then an estimate of the
    full-data sum from those rows."""
    N = len(X)
    ell, kls = 0.0, []
    for i in range(0, N, chunk):
        e, k = model.elbo_terms((X[i : i + chunk], Y[i : i + chunk]), num_samples, seed=i)
        ell += float(np.mean(e.numpy())) * len(X[i : i + chunk]) / N
        kls.append(float(np.mean(k.numpy())))
    return (ell - float(np.mean(kls))) / (model.num_data or N)


def _m(posterior: str, num_inducing: int):
    """M where it changes the model (global inducing images, inducing-weight size), else None."""
    return None if posterior in ("factorised", "ensemble_w", "local") else num_inducing


def _options_text(options) -> str:
    """Canonical text of a cell's posterior options ("" for the builder's defaults)."""
    return json.dumps(options, sort_keys=True) if options else ""


def cell_key(row: dict) -> tuple:
    return (
        row["dataset"],
        row["architecture"],
        row["posterior"],
        row["prior"],
        row["seed"],
        row["steps"],
        _m(row["posterior"], row["num_inducing"]),
        _options_text(row.get("posterior_options")),
    )


def run_cell(args, data, posterior: str, prior: str, seed: int) -> dict:
    Xtr, Xte = dg.datasets.standardise_images(data.X_train, data.X_test)
    Ytr, Yte = data.Y_train, data.Y_test
    model = dg.build_conv_bnn(
        Xtr,
        Ytr,
        architecture=args.architecture,
        posterior=posterior,
        prior=prior,
        num_inducing=args.num_inducing,
        seed=seed,
        **args.options,
    )
    ckpt = None
    if args.checkpoint_dir:
        tag = "-".join(f"{k}{v}" for k, v in sorted(args.options.items()))
        ckpt = Path(args.checkpoint_dir) / (
            f"{args.dataset}-{args.architecture}-{posterior}-{prior}-{seed}-{args.steps}"
            + (f"-{tag}" if tag else "")
        )
    kwargs = {}
    if args.kl_schedule != "none":
        kwargs["kl_schedule"] = args.kl_schedule
    start = time.perf_counter()
    history = dg.fit(
        model,
        (Xtr, Ytr),
        steps=args.steps,
        batch_size=min(args.batch_size, len(Xtr)),
        learning_rate=args.lr,
        num_samples=args.train_samples,
        seed=seed,
        checkpoint_dir=ckpt,
        log_every=max(1, args.steps // 20),
        progress=True,
        **kwargs,
    )
    train_seconds = time.perf_counter() - start
    steps_run = args.steps - history.resumed_from
    row = {
        "dataset": args.dataset,
        "architecture": args.architecture,
        "posterior": posterior,
        "prior": prior,
        "seed": seed,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "num_inducing": args.num_inducing,
        "lr": args.lr,
        "kl_schedule": args.kl_schedule,
        "test_samples": args.test_samples,
        "posterior_options": args.options,
        # steady state: between the first and last logged steps (tracing and start-up excluded)
        "ms_per_step": (
            1000.0
            * (history.wall_time[-1] - history.wall_time[0])
            / (history.step[-1] - history.step[0])
            if len(history.step) > 1
            else 1000.0 * train_seconds / max(1, steps_run)
        ),
        "train_seconds": train_seconds,
        "elbo_per_image": elbo_per_image(
            model, Xtr[: args.elbo_rows or None], Ytr[: args.elbo_rows or None], args.test_samples
        ),
        "elbo_rows": min(args.elbo_rows or len(Xtr), len(Xtr)),
        "parameters": dg.parameter_count(model),
    }
    row.update(evaluate(model, Xte, Yte, args.test_samples))
    # the home folder as ~, so the recorded command reads the same on any machine
    row["command"] = " ".join([os.path.basename(sys.executable)] + sys.argv).replace(
        os.path.expanduser("~"), "~"
    )
    return row


def sweep(args):
    if args.paper:
        args.architecture, args.num_inducing, args.batch_size, args.lr = "resnet", 500, 500, 1e-2
        args.train_samples, args.test_samples, args.kl_schedule = 1, 10, "paper"
    try:
        args.options = json.loads(args.posterior_options) if args.posterior_options else {}
    except json.JSONDecodeError as err:
        raise SystemExit(f"--posterior-options is not a JSON object: {err}") from None
    if not isinstance(args.options, dict):
        raise SystemExit("--posterior-options must be a JSON object, e.g. '{\"lambda_max\": 0.03}'")
    data = load(args.dataset, args.path, args.split)
    done = {cell_key(row) for row in read_lines(args.out)}
    for seed in map(int, args.seeds.split(",")):
        for prior in args.priors.split(","):
            for posterior in args.posteriors.split(","):
                key = (
                    args.dataset,
                    args.architecture,
                    posterior,
                    prior,
                    seed,
                    args.steps,
                    _m(posterior, args.num_inducing),
                    _options_text(args.options),
                )
                if key in done:
                    continue
                print(
                    f"== {args.dataset} {args.architecture} {posterior} {prior} seed {seed}",
                    flush=True,
                )
                row = run_cell(args, data, posterior, prior, seed)
                append_line(args.out, row)
                print(json.dumps(row), flush=True)


#: Published LeNet-5 numbers on MNIST (60,000 / 10,000), printed under a report of MNIST rows.
PUBLISHED_MNIST = (
    "LeCun, Bottou, Bengio & Haffner (1998), *Gradient-based learning applied to document "
    "recognition*, Proc. IEEE 86(11), Section III: LeNet-5 (a point estimate, tanh units, trained "
    "20 passes with a stochastic diagonal Levenberg-Marquardt method) has a test error of 0.95% "
    "(accuracy 99.05%), 0.8% (99.2%) when trained on the images plus distorted copies. The paper "
    "reports no test log-likelihood or calibration.",
)


def _settings_lines(rows) -> list:
    """One line per distinct training setting (batch, learning rate, KL schedule, test samples)."""
    seen = sorted(
        {
            (
                r["dataset"],
                r["steps"],
                r["batch_size"],
                r["lr"],
                r["kl_schedule"],
                r["test_samples"],
                r.get("elbo_rows") or 0,
            )
            for r in rows
        }
    )
    return [
        f"* {d}: {st:,} steps of batch {b} (Adam, learning rate {lr:g}), KL schedule `{kl}`, "
        f"{ts} test samples" + (f", ELBO estimated on the first {n:,} training images" if n else "")
        for d, st, b, lr, kl, ts, n in seen
    ]


def _groups(rows) -> dict:
    """The rows by table row: ``(dataset, net, steps, prior, posterior label)`` -> rows."""
    groups = {}
    for r in rows:
        label = r["posterior"]
        if r["posterior"] in INDUCING_WEIGHTS and _m(r["posterior"], r["num_inducing"]) is not None:
            label += f" M={r['num_inducing']}"
        if r.get("posterior_options"):
            label += " " + ", ".join(f"{k}={v}" for k, v in sorted(r["posterior_options"].items()))
        groups.setdefault(
            (r["dataset"], r["architecture"], r["steps"], r["prior"], label), []
        ).append(r)
    return groups


def render_report(rows, results: str, out: str | None = None, plot_path: str | None = None) -> str:
    """The report (markdown) of the result lines ``rows`` read from ``results``; ``out`` and
    ``plot_path`` are where it and the plot go, named in its command line."""
    groups = _groups(rows)
    lines = [
        "# Convolutional BNNs on images",
        "",
        "Mean ± standard error over seeds (n = number of seeds). Accuracy and ECE in %, test "
        "log-likelihood and ELBO per image in nats; ms/step on the machine that ran the cell "
        "(compare only within one file).",
        "",
        f"Produced by `python benchmarks/images.py report --results {results} --out {out}"
        + (f" --plot {plot_path}" if plot_path else "")
        + "`; "
        "each row's sweep command is in the JSON lines.",
        "",
    ]
    commands = sorted({r["command"] for r in rows if "command" in r})
    if len(commands) <= 3:
        lines += ["Sweep command(s):", ""] + [f"    {c}" for c in commands] + [""]
    lines += ["Settings:", ""] + _settings_lines(rows) + [""]
    lines += [
        "| dataset | net | steps | prior | posterior | n | accuracy | test LL | ECE | entropy | "
        "ELBO/N | ms/step | params |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = {p: i for i, p in enumerate(POSTERIORS + INDUCING_WEIGHTS)}
    for key in sorted(
        groups, key=lambda k: (k[0], k[1], k[2], k[3], order.get(k[4].split()[0], 9), k[4])
    ):
        g = groups[key]

        def cell(name, scale=1.0, digits=3):
            m, s, _ = mean_se(r[name] * scale for r in g)
            return f"{m:.{digits}f}" + ("" if math.isnan(s) else f" ± {s:.{digits}f}")

        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {key[4]} | {len(g)} | "
            f"{cell('accuracy', 100, 1)} | {cell('test_ll')} | {cell('ece', 100, 1)} | "
            f"{cell('entropy')} | {cell('elbo_per_image')} | {cell('ms_per_step', 1, 0)} | "
            + (f"{g[0]['parameters']:,}" if "parameters" in g[0] else "")
            + " |"
        )
    if any(r["dataset"] == "mnist" for r in rows):
        lines += ["", "Published LeNet numbers on MNIST:", ""] + [f"* {p}" for p in PUBLISHED_MNIST]
    if plot_path:
        lines += [
            "",
            "![accuracy, test log-likelihood and ECE against training "
            f"time]({os.path.basename(plot_path)})",
        ]
    return "\n".join(lines) + "\n"


def report(args):
    rows = read_lines(args.results)
    text = render_report(rows, args.results, args.out, args.plot)
    if args.plot:
        plot(_groups(rows), args.plot)
    if args.out:
        Path(args.out).write_text(text)
    print(text)


def plot(groups: dict, path: str) -> None:
    """Accuracy, test log-likelihood and ECE against training time (seconds, mean over seeds), one
    line per (dataset, net, prior, posterior) through its step budgets: the posterior's family
    colour, a line style per prior, each point labelled with its step budget (first panel)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks import plot_style

    lines = {}
    for (dataset, net, steps, prior, label), g in groups.items():
        if any("train_seconds" not in r for r in g):
            continue
        point = (
            np.mean([r["train_seconds"] for r in g]),
            np.mean([r["accuracy"] for r in g]) * 100,
            np.mean([r["test_ll"] for r in g]),
            np.mean([r["ece"] for r in g]) * 100,
            steps,
        )
        lines.setdefault((dataset, net, prior, label), []).append(point)
    priors = sorted({key[2] for key in lines})
    linestyles = {pr: plot_style.variant_linestyle(i) for i, pr in enumerate(priors)}
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    tags = []
    for (dataset, net, prior, label), points in sorted(lines.items()):
        points.sort()
        t = [p[0] for p in points]
        name = f"{label}, {prior} prior" + (
            "" if len({k[0] for k in lines}) == 1 else f" ({dataset} {net})"
        )
        for ax, k in zip(axes, (1, 2, 3)):
            ax.plot(
                t,
                [p[k] for p in points],
                marker="o",
                ms=5,
                ls=linestyles[prior],
                color=plot_style.family_colour(label, "bnn"),
                label=name,
            )
        tags += [(tx, p[1], f"{p[4]:,}") for tx, p in zip(t, points)]
    units = ("test accuracy (%)", "test log-likelihood (nats per image)", "ECE (%)")
    for ax, name in zip(axes, units):
        ax.set_title(name, fontsize=10)
        ax.set_ylabel(name)
        ax.set_xlabel("training time (s)")
        ax.grid(alpha=0.3)
        ax.margins(0.08)
    fig.suptitle(
        "labels in the first panel: training steps; colour: the posterior family, line style: the "
        "prior; training times from the machine that ran each row (its load differed between rows)",
        fontsize=9,
    )
    fig.tight_layout()
    plot_style.legend_outside(fig, where="below", ncol=3, fontsize=9)
    plot_style.place_labels(axes[0], tags, fontsize=7)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sweep")
    s.add_argument("--dataset", default="digits", choices=("digits", "mnist", "cifar10"))
    s.add_argument(
        "--path",
        default=None,
        help="CIFAR-10's folder; for MNIST a folder of IDX files or an .npz "
        "(default: where tools/fetch_mnist.py put it)",
    )
    s.add_argument("--split", type=int, default=0)
    s.add_argument("--architecture", default="lenet", choices=("lenet", "resnet"))
    s.add_argument("--posteriors", default=",".join(POSTERIORS))
    s.add_argument("--priors", default=",".join(PRIORS))
    s.add_argument("--seeds", default="0,1,2")
    s.add_argument("--steps", type=int, default=1000)
    s.add_argument("--batch-size", type=int, default=500)
    s.add_argument("--num-inducing", type=int, default=100)
    s.add_argument("--lr", type=float, default=1e-2)
    s.add_argument("--train-samples", type=int, default=1)
    s.add_argument("--test-samples", type=int, default=10)
    s.add_argument("--kl-schedule", default="paper", help="'paper', 'linear' or 'none'")
    s.add_argument(
        "--posterior-options",
        default=None,
        help='JSON object of build_conv_bnn posterior options, e.g. \'{"lambda_max": 0.03, '
        '"sd_max": 0.1}\' '
        "(part of the cell's key)",
    )
    s.add_argument(
        "--elbo-rows",
        type=int,
        default=None,
        help="estimate the ELBO per image on the first this many training images (default: all)",
    )
    s.add_argument(
        "--paper", action="store_true", help="O&A App. O settings (resnet, M=500, batch 500, ...)"
    )
    s.add_argument("--checkpoint-dir", default=None)
    s.add_argument("--out", required=True)
    r = sub.add_parser("report")
    r.add_argument("--results", required=True)
    r.add_argument("--out", default=None)
    r.add_argument(
        "--plot",
        default=None,
        help="also write a PNG of accuracy, test LL and ECE against training time",
    )
    args = parser.parse_args(argv)
    if args.command == "sweep":
        if args.dataset == "cifar10" and not args.path:
            parser.error("--path is required for cifar10")
        sweep(args)
    else:
        report(args)


if __name__ == "__main__":
    main()
