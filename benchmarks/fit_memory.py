"""Memory of repeated ``fit`` calls on one model in one process, and of repeated evaluations.

A long run resumed segment by segment (``fit(model, data, steps=..., checkpoint_dir=...)`` called
again and again in one process, as ``benchmarks/mnist_dgp.py`` does) grew in resident memory with
every call. Each trace of a training step stays in memory for the rest of the process
(TensorFlow's global gradient registry keeps the gradient of every ``tf.custom_gradient`` call
traced in graph mode, TensorFlow Probability's global bijector cache the input of every traced
parameter transform, and each holds its graph), and ``fit`` built and traced a new step per call.
``fit`` now keeps its step on the model and reuses it (``deepgp_gi.training.reuse``).

Each case runs in a fresh process: a deep GP (2,000 random rows, 50 inputs, depth 2, M = 50,
batch 500) and ``CALLS`` calls of ``fit(steps=20)`` (or
``fit(steps=20 * call, checkpoint_dir=...)``: one run resumed call after call), recording the
resident set size after each call and ``gc.collect()``, and the number of live ``FuncGraph``
objects at call 5 and at the last call.
The case "a new step per call" calls ``clear_cached_steps(model)`` before every ``fit``: the
behaviour before the fix. The case "evaluation" calls
``metrics.predict_class_probabilities`` in chunks of 500 rows (a ``MultiClass(10)`` model, as
``benchmarks/mnist_dgp.py``'s evaluation) ``CALLS`` times.

    python benchmarks/fit_memory.py --out benchmarks/results/fit_memory.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CALLS = 20

CHILD = r"""
import gc, json, os, sys, tempfile
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import gpflow
from tensorflow.python.framework.func_graph import FuncGraph
import deepgp_gi as dg
from deepgp_gi.training.reuse import clear_cached_steps

case, calls = sys.argv[1], int(sys.argv[2])

def rss_mb():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0

def graphs():
    gc.collect()
    return sum(isinstance(o, FuncGraph) for o in gc.get_objects())

rng = np.random.default_rng(0)
X = rng.normal(size=(2000, 50))
if case == "evaluation":
    Y = rng.integers(0, 10, size=(2000, 1)).astype(np.float64)
    model = dg.build_deep_gp(X, Y, depth=2, num_inducing=50, seed=0,
                             likelihood=gpflow.likelihoods.MultiClass(10))
else:
    Y = rng.normal(size=(2000, 1))
    model = dg.build_deep_gp(X, Y, depth=2, num_inducing=50, seed=0)
folder = tempfile.mkdtemp()
rss, counts = [], {}
for call in range(1, calls + 1):
    if case == "evaluation":
        dg.metrics.predict_class_probabilities(model, X[:1000], 5, chunk_size=500, seed=1)
    else:
        if case.startswith("new"):
            clear_cached_steps(model)
        checkpoints = case.endswith("checkpoints")
        dg.fit(model, (X, Y), steps=20 * call if checkpoints else 20, batch_size=500, seed=1,
               progress=False, checkpoint_dir=folder if checkpoints else None)
    gc.collect()
    rss.append(rss_mb())
    if call in (5, calls):
        counts[call] = graphs()
print(json.dumps(dict(case=case, rss=rss, graphs=counts)))
"""

CASES = [
    ("new", "fit, a new step per call (before)"),
    ("new_checkpoints", "fit with checkpoint_dir, a new step per call (before)"),
    ("reused", "fit, the step reused (after)"),
    ("reused_checkpoints", "fit with checkpoint_dir, the step reused (after)"),
    ("evaluation", "predict_class_probabilities in chunks of 500"),
]


def measure(case: str, calls: int) -> dict:
    t = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", CHILD, case, str(calls)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["seconds"] = time.perf_counter() - t
    return result


def report(results, calls: int, command: str) -> str:
    lines = [
        "# Memory of repeated fit calls on one model",
        "",
        f"`{command}` (one process per row, {calls} calls each; `benchmarks/fit_memory.py`'s "
        "docstring describes the cases). Resident set size after each call and `gc.collect()`; "
        f"growth per call is (RSS at call {calls} - RSS at call 5) / {calls - 5}.",
        "",
        "| case | RSS call 1 (MB) | RSS call 5 | RSS call "
        f"{calls} | growth per call (MB) | live FuncGraphs call 5 | call {calls} |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (case, label), r in zip(CASES, results):
        rss, g = r["rss"], r["graphs"]
        per_call = (rss[-1] - rss[4]) / (calls - 5)
        lines.append(
            f"| {label} | {rss[0]:.0f} | {rss[4]:.0f} | {rss[-1]:.0f} | {per_call:+.2f} | "
            f"{g['5']} | {g[str(calls)]} |"
        )
    lines += ["", "RSS after each call (MB):", ""]
    for (case, label), r in zip(CASES, results):
        lines.append(f"* {case}: " + ", ".join(f"{x:.0f}" for x in r["rss"]))
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=CALLS)
    parser.add_argument("--out", default=None, help="write the Markdown table here")
    args = parser.parse_args(argv)
    if args.calls < 6:
        raise SystemExit("--calls must be at least 6")
    results = []
    for case, label in CASES:
        results.append(measure(case, args.calls))
        print(f"{label}: {results[-1]['seconds']:.0f} s", file=sys.stderr)
    argv_text = " ".join(sys.argv[1:] if argv is None else argv)
    text = report(results, args.calls, f"python benchmarks/fit_memory.py {argv_text}".strip())
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
