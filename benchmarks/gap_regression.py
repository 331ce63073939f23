"""Toy gap regression of Ober & Aitchison (2021) §3.1 / App. J, Table 2.

40 points with x in [-4,-2] U [2,4], y = x^3 + N(0, 3^2), inputs and outputs standardised; a
2 x 50 ReLU BNN with NealPrior; the noise variance fixed at its true value in standardised units;
M = 100 inducing points with U_0 ~ N(0, 1); full-batch Adam, lr 1e-2, 10 training samples and
100 test samples. For each posterior (factorised, local inducing, global inducing) the script
records the final ELBO (total over the 40 points, the scale of the paper's table), the
predictive standard deviation of f inside the gap, and the intermediate-function variances
V[F_l] = E_x[(1/N_l) sum_lambda Var f_lambda^l(x)], x ~ N(0, 1) (standardised inputs).

Each finished method appends one JSON line to ``results/gap_regression.jsonl``; a rerun with the
same settings skips the methods already there (delete the file to start over). The Markdown
summary ``results/gap_regression.md`` is rewritten from the JSON lines at the end.

    python benchmarks/gap_regression.py                 # the paper's 5000 steps
    python benchmarks/gap_regression.py --steps 500     # quicker, for a loaded machine
"""

from __future__ import annotations

if not __package__:  # run by path: load benchmarks/ as the package (benchmarks/_by_path.py)
    import _by_path  # noqa: F401  (imported for its side effect)

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gpflow
import numpy as np
import tensorflow as tf
from tqdm import tqdm

from benchmarks.common import append_line, code_commit, read_lines
from deepgp_gi.bnn import build_bnn
from deepgp_gi.datasets import gap_regression

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
METHODS = ("factorised", "local", "global")
#: O&A App. J Table 2: ELBO, V[F1], V[F2], V[F3].
PAPER = {
    "factorised": (-4.585, 0.0728, 0.4765, 0.1926),
    "local": (-5.469, 0.0763, 0.4473, 0.0643),
    "global": (2.236, 0.4820, 0.4877, 1.0820),
}
NOISE_STD = 3.0


def make_data(seed: int):
    """Standardised (X, Y), the raw statistics and the noise variance in standardised units."""
    X, Y = gap_regression(40, seed=seed)
    x_mean, x_std = X.mean(0), X.std(0)
    y_mean, y_std = Y.mean(0), Y.std(0)
    Xs, Ys = (X - x_mean) / x_std, (Y - y_mean) / y_std
    noise_var = float((NOISE_STD / y_std[0]) ** 2)
    return (
        Xs,
        Ys,
        dict(
            x_mean=float(x_mean[0]),
            x_std=float(x_std[0]),
            y_mean=float(y_mean[0]),
            y_std=float(y_std[0]),
            noise_variance=noise_var,
        ),
    )


def run_method(method: str, args, Xs, Ys, stats) -> dict:
    tf.random.set_seed(args.seed)
    likelihood = gpflow.likelihoods.Gaussian(variance=stats["noise_variance"])
    gpflow.set_trainable(likelihood, False)
    model = build_bnn(
        Xs,
        Ys,
        hidden=(50, 50),
        posterior=method,
        prior="neal",
        num_inducing=args.num_inducing,
        activation="relu",
        likelihood=likelihood,
        seed=args.seed,
    )
    X, Y = tf.constant(Xs), tf.constant(Ys)
    opt = tf.optimizers.Adam(args.lr)
    variables = model.trainable_variables

    @tf.function
    def step(i):
        with tf.GradientTape() as tape:
            elbo = model.elbo(
                (X, Y), args.train_samples, seed=tf.stack([tf.constant(args.seed, tf.int64), i])
            )
            loss = -elbo
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return elbo

    start = time.time()
    bar = tqdm(range(args.steps), desc=method, mininterval=2.0, file=sys.stderr)
    for i in bar:
        elbo = step(tf.constant(i, tf.int64))
        if i % 100 == 0 or i == args.steps - 1:
            bar.set_postfix(elbo=f"{float(elbo):.3f}")
    train_time = time.time() - start

    # Final ELBO: the mean of 100 samples' estimates, and its standard error.
    per_sample = model.elbo_per_sample((Xs, Ys), args.test_samples, seed=10_000 + args.seed).numpy()
    # Predictive std of f in the gap (raw x in (-2, 2)) and outside it (raw |x| in [2, 4]).
    gap_raw = np.linspace(-1.9, 1.9, 39)[:, None]
    out_raw = np.concatenate([np.linspace(-4, -2, 21), np.linspace(2, 4, 21)])[:, None]

    def to_std(x):
        return (x - stats["x_mean"]) / stats["x_std"]

    _, gap_var = model.predict_f(to_std(gap_raw), args.test_samples, seed=20_000 + args.seed)
    _, out_var = model.predict_f(to_std(out_raw), args.test_samples, seed=30_000 + args.seed)
    # V[F_l] with x ~ N(0, 1) in standardised input space.
    xs = np.random.default_rng(args.seed).standard_normal((200, 1))
    layers = model.sample_layers(xs, args.test_samples, seed=40_000 + args.seed)
    v_f = [float(tf.reduce_mean(tf.math.reduce_variance(F, axis=0))) for F in layers]
    return dict(
        method=method,
        elbo=float(per_sample.mean()),
        elbo_se=float(per_sample.std() / np.sqrt(len(per_sample))),
        elbo_per_point=float(per_sample.mean() / len(Xs)),
        gap_pred_std=float(np.sqrt(gap_var.numpy()).mean()),
        outside_pred_std=float(np.sqrt(out_var.numpy()).mean()),
        V_F=v_f,
        paper_elbo=PAPER[method][0],
        paper_V_F=list(PAPER[method][1:]),
        train_seconds=round(train_time, 1),
    )


def config_of(args) -> dict:
    return dict(
        steps=args.steps,
        lr=args.lr,
        seed=args.seed,
        num_inducing=args.num_inducing,
        train_samples=args.train_samples,
        test_samples=args.test_samples,
    )


def write_markdown(rows, config: dict, command: str, noise_variance: float, path: Path) -> None:
    """The summary of ``rows`` (one per method, run with ``config``, :func:`config_of`) written to
    ``path``."""
    lines = [
        "# Toy gap regression (O&A 2021 §3.1, App. J Table 2)",
        "",
        f"Command: `{command}`",
        "",
        f"Settings: {json.dumps(config)}; 2x50 ReLU BNN, NealPrior, noise variance fixed at "
        f"(3 / std y)^2 = {noise_variance:.5f} (standardised units), U_0 ~ N(0, 1), "
        "full-batch Adam. ELBO = total over the 40 points (mean of 100 sample estimates +- s.e.). "
        "Predictive std = std of f (standardised output units), averaged over a grid of raw x in "
        "the gap (-1.9..1.9) and outside it (|x| in [2, 4]). V[F_l] as in App. J (x ~ N(0,1)).",
        "",
        "| method | ELBO (ours) | ELBO (paper) | ELBO / point | pred. std in gap | "
        "pred. std outside | V[F1] | V[F2] | V[F3] | V[F] paper | train s | commit |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        vf = " | ".join(f"{v:.4f}" for v in r["V_F"])
        paper_vf = ", ".join(f"{v:.4f}" for v in r["paper_V_F"])
        lines.append(
            f"| {r['method']} | {r['elbo']:.3f} ± {r['elbo_se']:.3f} | {r['paper_elbo']:.3f} | "
            f"{r['elbo_per_point']:.4f} | {r['gap_pred_std']:.3f} | {r['outside_pred_std']:.3f} | "
            f"{vf} | {paper_vf} | {r['train_seconds']} | {r.get('commit', '')} |"
        )
    if config["steps"] != 5000:
        lines += [
            "",
            f"**Note:** run with {config['steps']} steps instead of the paper's 5000 (machine "
            "load); rerun without `--steps` for the reference setting.",
        ]
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--steps", type=int, default=5000, help="Adam steps per method (paper: 5000)"
    )
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument(
        "--seed", type=int, default=0, help="seeds the data, initialisation and noise"
    )
    parser.add_argument("--num-inducing", type=int, default=100)
    parser.add_argument("--train-samples", type=int, default=10)
    parser.add_argument("--test-samples", type=int, default=100)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS / "gap_regression.jsonl",
        help="JSON lines file (the Markdown summary goes next to it, .md)",
    )
    args = parser.parse_args(argv)
    command = "python benchmarks/gap_regression.py" + (
        ""
        if argv is None and len(sys.argv) == 1
        else " " + shlex.join(sys.argv[1:] if argv is None else argv)
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Xs, Ys, stats = make_data(args.seed)
    config = config_of(args)
    done = {row["method"]: row for row in read_lines(str(args.out)) if row.get("config") == config}
    for method in args.methods:
        if method in done:
            print(f"{method}: already in {args.out}, skipping", file=sys.stderr)
            continue
        row = run_method(method, args, Xs, Ys, stats)
        row.update(config=config, commit=code_commit(), command=command)
        append_line(str(args.out), row)
        done[method] = row
        print(
            json.dumps({k: row[k] for k in ("method", "elbo", "gap_pred_std", "V_F")}),
            file=sys.stderr,
        )
    write_markdown(
        [done[m] for m in METHODS if m in done],
        config,
        command,
        stats["noise_variance"],
        args.out.with_suffix(".md"),
    )


if __name__ == "__main__":
    main()
