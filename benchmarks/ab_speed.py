"""A/B training-step time of two checkouts of deepgp_gi, in one run.

Two long-lived worker processes import the package from two source trees (``--a`` and ``--b``,
e.g. the previous release and the working tree). For every family the parent asks each worker in
turn to time a few compiled Adam steps, alternating A and B round by round, so that machine load
falls on both alike; the table reports the medians and the ratio B/A. Only public API present in
both trees is used: ``build_deep_gp``, ``build_bnn`` and ``model.elbo(data, S, noise_source)``;
each tree's step uses that tree's ``fit`` optimiser (``deepgp_gi.training.adam`` where it exists).

    python benchmarks/ab_speed.py --a /path/to/old/tree --b . --out benchmarks/results/ab_speed.md
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys

WORKER = r"""
import json, os, sys, time
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import gpflow, numpy as np, tensorflow as tf
import deepgp_gi as dg
from deepgp_gi.noise import SeededNoise

def data(n, seed=0):
    X, Y, _ = dg.datasets.load_uci_raw("kin8nm")
    X = (X - X.mean(0)) / X.std(0); Y = (Y - Y.mean(0)) / Y.std(0)
    idx = np.random.default_rng(seed).permutation(len(X))[:n]
    return X[idx], Y[idx]

steps = {}
def build(key):
    kind, name, depth, batch, M = key.split(":")
    X, Y = data(int(batch))
    if kind == "gp":
        model = dg.build_deep_gp(
            X, Y, depth=int(depth), posterior=name, num_inducing=int(M), inner_width=8, seed=0
        )
    else:
        model = dg.build_bnn(
            X, Y, hidden=(50,) * int(depth), posterior=name, num_inducing=int(M), seed=0
        )
    Xt, Yt = tf.constant(X), tf.constant(Y)
    variables = model.trainable_variables
    # each tree's own fit optimiser (trees before deepgp_gi.training.adam used tf_keras's Adam)
    adam = getattr(dg.training, "adam", None)
    opt = adam(0.01, variables) if adam else gpflow.keras.tf_keras.optimizers.Adam(0.01)
    @tf.function
    def step(t):
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(variables)
            loss = -model.elbo((Xt, Yt), 1, SeededNoise(tf.stack([t, tf.constant(0, tf.int64)])))
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss
    for t in range(3):
        step(tf.constant(t, tf.int64))  # trace and warm up
    return step

for line in sys.stdin:
    key, n = line.split()
    if key not in steps:
        steps[key] = build(key)
    step = steps[key]
    times = []
    for t in range(int(n)):
        t0 = time.perf_counter()
        step(tf.constant(t, tf.int64)).numpy()
        times.append(time.perf_counter() - t0)
    print(json.dumps(times), flush=True)
"""

CONFIGS = [
    "gp:mean_field:3:1000:100",
    "gp:fully_coupled:2:512:32",
    "gp:stripes_arrow:3:512:64",
    "gp:stripes_arrow:3:1000:100",
    "gp:global:3:1000:100",
    "gp:local:3:1000:100",
    "bnn:factorised:2:1000:100",
    "bnn:global:2:1000:100",
    "bnn:factorised_global:2:1000:100",
    "bnn:local:2:1000:100",
]


def start(tree: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.Popen(
        [sys.executable, "-c", WORKER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd="/",
    )


def ask(worker: subprocess.Popen, key: str, n: int):
    worker.stdin.write(f"{key} {n}\n")
    worker.stdin.flush()
    return json.loads(worker.stdout.readline())


def commit_of(tree: str) -> str:
    out = subprocess.run(
        ["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "-C", tree, "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return out.stdout.strip() + ("+changes" if dirty else "")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="source tree A (the baseline)")
    parser.add_argument("--b", required=True, help="source tree B")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps-per-round", type=int, default=4)
    parser.add_argument("--only", default=None, help="comma-separated config keys (default: all)")
    parser.add_argument("--out", default=None, help="write the markdown table here")
    args = parser.parse_args(argv)
    import numpy as np

    configs = args.only.split(",") if args.only else CONFIGS
    workers = {"A": start(args.a), "B": start(args.b)}
    rows = []
    for key in configs:
        times = {"A": [], "B": []}
        for r in range(args.rounds):
            order = ("A", "B") if r % 2 == 0 else ("B", "A")
            for side in order:
                times[side] += ask(workers[side], key, args.steps_per_round)
        a, b = 1e3 * np.median(times["A"]), 1e3 * np.median(times["B"])
        rows.append((key, a, b, b / a))
        print(f"{key:<36} A {a:8.2f} ms  B {b:8.2f} ms  B/A {b / a:5.2f}", flush=True)
    for w in workers.values():
        w.stdin.close()
        w.wait()
    command = "python " + " ".join(
        shlex.quote(x) for x in [os.path.relpath(__file__)] + (argv or sys.argv[1:])
    )
    lines = [
        "# A/B training-step time",
        "",
        f"Command: `{command}`; A = {commit_of(args.a)}, B = {commit_of(args.b)}; "
        f"{args.rounds} rounds x {args.steps_per_round} steps, A and B alternated per round; "
        "median ms per compiled Adam step (1 sample, float64, kin8nm rows). Config = "
        "kind:family:depth:batch:M (BNN depth = hidden layers of width 50; GP inner width 8).",
        "",
        "| config | A ms | B ms | B / A |",
        "|---|---|---|---|",
    ] + [f"| {k} | {a:.2f} | {b:.2f} | {r:.2f} |" for k, a, b, r in rows]
    if args.out:
        with open(args.out, "w") as fh:
            fh.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
