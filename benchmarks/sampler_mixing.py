"""How well does the SGHMC chain mix, direction by direction, on a posterior known exactly?

    python benchmarks/sampler_mixing.py [--collect-steps 0.01,0.03] [--seeds 8] [--steps 5000]
        [--num-samples 1000] [--thin 10] [--threads 1]
        [--out benchmarks/results/sampler_mixing.jsonl] [--md benchmarks/results/sampler_mixing.md]

The one-layer oracle of the sampler's tests: 40 points, ``y = sin(2x) + noise`` on ``[-3, 3]``,
``build_deep_gp(X, Y, depth=1, posterior="sghmc", num_inducing=6, seed=0)`` with a Gaussian
likelihood of variance 0.1, kernel, inducing inputs and likelihood held fixed. The target of the
whitened inducing outputs ``V`` is then Gaussian with precision ``P = I + A W A^T`` and mean
``P^-1 A W (y - m)`` (``A = L_K^-1 K_ZX``, ``W = diag(1 / (s_n + sigma^2))``).

For each seed and collection step size: ``fit`` for ``--steps`` steps at the default step 0.01
(adapting), then ``collect_samples`` of ``--num-samples`` samples ``--thin`` steps apart at the
collection step. Along each eigen-direction of the exact covariance ``P^-1`` (weakest first) it
records the sample variance over the exact one, the integrated autocorrelation time of the thinned
samples (summed while the autocorrelation is above 0.05) and the effective sample size per 1,000
chain steps; per coordinate the mean's error in posterior SDs. One JSON line per (step size, seed)
goes to ``--out`` (lines already there are skipped); ``--md`` gets the table, with this command.
"""

from __future__ import annotations

if not __package__:  # run by path: load benchmarks/ as the package (benchmarks/_by_path.py)
    import _by_path  # noqa: F401  (imported for its side effect)

import argparse
import shlex
import sys
from typing import Dict, List

import numpy as np

from benchmarks.common import (
    append_line,
    code_commit,
    commands_footer,
    read_lines,
    set_threads,
)

OUT = "benchmarks/results/sampler_mixing.jsonl"
MD = "benchmarks/results/sampler_mixing.md"
#: the autocorrelation below which the sum of the integrated autocorrelation time stops
AUTOCORRELATION_CUTOFF = 0.05


def oracle_problem(posterior: str = "sghmc", hold_layer: bool = True, **options):
    """``(X, Y, model)``: the depth-1 model of ``posterior`` (a sampling family, with
    ``options``) on the oracle's data, its likelihood held fixed and, with ``hold_layer``, its
    kernel and inducing inputs too, so that only ``V`` moves."""
    import gpflow

    import deepgp_gi as dg

    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, size=(40, 1))
    Y = np.sin(2 * X) + np.sqrt(0.1) * rng.normal(size=(40, 1))
    model = dg.build_deep_gp(
        X,
        Y,
        depth=1,
        posterior=posterior,
        num_inducing=6,
        seed=0,
        likelihood=gpflow.likelihoods.Gaussian(variance=0.1),
        **options,
    )
    if hold_layer:
        gpflow.set_trainable(model.layers[0], False)
    gpflow.set_trainable(model.likelihood, False)
    return X, Y, model


def exact_posterior(model, X, Y):
    """``(mean [M], precision [M, M])`` of the whitened inducing outputs (module docs)."""
    import gpflow

    layer = model.layers[0]
    Z = layer.Z
    M = int(Z.shape[0])
    L = np.linalg.cholesky(layer.K(Z).numpy() + gpflow.config.default_jitter() * np.eye(M))
    A = np.linalg.solve(L, layer.K(Z, X).numpy())
    s = layer.K_diag(X).numpy() - np.sum(A**2, axis=0)
    W = 1.0 / (s + model.likelihood.variance.numpy())
    P = np.eye(M) + (A * W) @ A.T
    mean = np.linalg.solve(P, (A * W) @ (Y[:, 0] - layer.mean(X).numpy()[:, 0]))
    return mean, P


def autocorrelation_time(x: np.ndarray) -> float:
    """Integrated autocorrelation time of the series ``x`` [T], in its own steps."""
    x = x - x.mean()
    n = len(x)
    f = np.fft.rfft(x, 2 * n)
    acf = np.fft.irfft(f * np.conj(f))[:n]
    acf = acf / acf[0]
    below = np.nonzero(acf < AUTOCORRELATION_CUTOFF)[0]
    end = below[0] if len(below) else n
    return float(1.0 + 2.0 * np.sum(acf[1:end]))


def run_one(collect_step: float, seed: int, args) -> Dict:
    import deepgp_gi as dg

    X, Y, model = oracle_problem()
    mean, P = exact_posterior(model, X, Y)
    dg.fit(model, (X, Y), steps=args.steps, seed=seed, progress=False)
    samples = dg.collect_samples(
        model,
        (X, Y),
        num_samples=args.num_samples,
        thin=args.thin,
        seed=seed,
        progress=False,
        step_size=collect_step,
    )
    S = samples[0].numpy()[:, :, 0]
    covariance = np.linalg.inv(P)
    variances, directions = np.linalg.eigh(covariance)
    order = np.argsort(variances)[::-1]  # weakest direction (largest variance) first
    variances, directions = variances[order], directions[:, order]
    along = (S - mean) @ directions
    iat = np.array([autocorrelation_time(along[:, k]) for k in range(along.shape[1])])
    return dict(
        collect_step=collect_step,
        seed=seed,
        steps=args.steps,
        num_samples=args.num_samples,
        thin=args.thin,
        precisions=[round(float(1.0 / v), 3) for v in variances],
        variance_ratio=[round(float(r), 4) for r in np.var(along, axis=0) / variances],
        mean_error_sd=[
            round(float(e), 4) for e in (S.mean(axis=0) - mean) / np.sqrt(np.diag(covariance))
        ],
        autocorrelation_steps=[round(float(t * args.thin), 1) for t in iat],
        ess_per_1000_steps=[round(float(1000.0 / (t * args.thin)), 2) for t in iat],
        commit=code_commit(),
        command=args.command,
    )


def passes(line: Dict) -> bool:
    """The oracle's bounds: every mean within 1 SD (0.5 on average), every variance ratio in
    [0.6, 1.5]."""
    err = np.abs(line["mean_error_sd"])
    ratio = np.asarray(line["variance_ratio"])
    return bool(err.max() < 1.0 and err.mean() < 0.5 and ratio.min() >= 0.6 and ratio.max() <= 1.5)


def report(lines: List[Dict]) -> str:
    steps = sorted({l["collect_step"] for l in lines})
    out = [
        "# SGHMC mixing on the one-layer oracle, direction by direction",
        "",
        "Depth 1, N = 40, M = 6, Gaussian likelihood of variance 0.1, everything but the inducing",
        "outputs held fixed; `fit` for 5,000 steps at the default step 0.01, then 1,000 samples 10",
        "steps apart at the collection step. Directions: eigen-directions of the exact covariance,",
        "weakest (smallest precision) first. Medians over seeds, [min, max] in brackets.",
        "",
    ]
    if lines:
        precisions = lines[0]["precisions"]
        head = " | ".join(f"dir {k + 1} (prec {p:g})" for k, p in enumerate(precisions))
        out += [f"| collect step | seeds | passes | quantity | {head} |"]
        out += ["|---" * (4 + len(precisions)) + "|"]
        for step in steps:
            rows = [l for l in lines if l["collect_step"] == step]
            n_pass = sum(passes(l) for l in rows)
            for key, label in (
                ("variance_ratio", "variance / exact"),
                ("ess_per_1000_steps", "ESS per 1,000 steps"),
                ("autocorrelation_steps", "autocorrelation time (steps)"),
            ):
                values = np.array([l[key] for l in rows])
                cells = " | ".join(
                    f"{np.median(values[:, k]):.2f} [{values[:, k].min():.2f}, "
                    f"{values[:, k].max():.2f}]"
                    for k in range(values.shape[1])
                )
                out.append(
                    f"| {step:g} | {len(rows)} | {n_pass} / {len(rows)} | {label} | {cells} |"
                )
        out.append("")
        out.append(
            "`passes`: every coordinate's mean within 1 posterior SD (0.5 on average) and every "
            "direction's variance within [0.6, 1.5] of the exact one."
        )
    out += commands_footer(lines)
    return "\n".join(out)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--collect-steps", default="0.01,0.03")
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--steps", type=int, default=5000)
    p.add_argument("--num-samples", type=int, default=1000)
    p.add_argument("--thin", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=OUT)
    p.add_argument("--md", default=MD)
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args(argv)
    args.command = " ".join(["python benchmarks/sampler_mixing.py", *map(shlex.quote, argv)])
    if not args.report_only:
        set_threads(args.threads)
        done = {(l["collect_step"], l["seed"]) for l in read_lines(args.out)}
        for step in [float(s) for s in args.collect_steps.split(",")]:
            for seed in range(args.seeds):
                if (step, seed) in done:
                    continue
                line = run_one(step, seed, args)
                append_line(args.out, line)
                print(
                    f"step {step:g} seed {seed}: variance/exact {line['variance_ratio']}, "
                    f"ESS/1000 steps {line['ess_per_1000_steps']}",
                    flush=True,
                )
    with open(args.md, "w") as f:
        f.write(report(read_lines(args.out)))
    print(f"wrote {args.md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
