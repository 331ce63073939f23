"""Natural gradients against Adam on a depth-2 mean-field deep GP (boston, split 0): the ELBO per
datapoint after the same number of steps, for a few natural-gradient step sizes.

    python benchmarks/natgrad.py --steps 1000    # writes benchmarks/results/natgrad.md
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

import deepgp_gi as dg

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--gammas", default="0.01,0.05,0.1")
    parser.add_argument("--dataset", default="boston")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "natgrad.md"))
    args = parser.parse_args(argv)
    data = dg.datasets.load_uci(args.dataset, 0)
    rows = []
    for gamma in [None] + [float(g) for g in args.gammas.split(",")]:
        model = dg.build_deep_gp(
            data.X_train, data.Y_train, depth=2, posterior="mean_field", seed=0
        )
        t0 = time.perf_counter()
        hist = dg.fit(
            model,
            (data.X_train, data.Y_train),
            steps=args.steps,
            seed=0,
            progress=False,
            log_every=max(1, args.steps // 10),
            natgrad_gamma=gamma,
        )
        wall = time.perf_counter() - t0
        elbos = [float(model.elbo((data.X_train, data.Y_train), 8, seed=s)) for s in range(16)]
        N = len(data.X_train)
        rows.append(
            (
                gamma,
                np.mean(elbos) / N,
                np.std(elbos) / np.sqrt(len(elbos)) / N,
                dg.metrics.test_log_likelihood(model, data.X_test, data.Y_test, data.y_std, 100),
                [e / N for e in hist.elbo],
                wall,
            )
        )
        print(rows[-1][:4], flush=True)
    command = "python " + " ".join(
        shlex.quote(a) for a in ["benchmarks/natgrad.py"] + (argv or sys.argv[1:])
    )
    lines = [
        "# Natural gradients against Adam",
        "",
        f"Command: `{command}`. {args.dataset} split 0, depth-2 mean-field deep GP (builder "
        f"defaults, M = 100), full batch, 1 sample per step, {args.steps} steps; Adam's learning "
        "rate 0.01 for every variable, or natural gradients of size gamma on every layer's q(U) "
        "with Adam (0.01) on the rest. ELBO per datapoint after training from 16 x 8 samples (± "
        "one standard error).",
        "",
        "| optimiser | ELBO / point | test LL | ELBO trace (every tenth of the run) | wall (s) |",
        "|---|---|---|---|---|",
    ]
    for gamma, e, se, ll, trace, wall in rows:
        name = "Adam" if gamma is None else f"natgrad {gamma:g} + Adam"
        lines.append(
            f"| {name} | {e:.3f} ± {se:.3f} | {ll:.3f} | {', '.join(f'{t:.2f}' for t in trace)} | "
            f"{wall:.0f} |"
        )
    with open(args.out, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
