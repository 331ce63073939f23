"""Large-data training from shards: points per second against replicas, time per epoch, peak
memory, and the ELBO after a fixed budget with Adam against natural gradients.

The data (a generated set of ``--rows`` rows, default 10^6, and the bundled kin8nm and protein
sets) are written once to TFRecord shards and streamed with ``dg.datasets.read_shards``, so the
training process never holds them in memory. Every configuration runs in its own process (logical
CPU devices must be configured before TensorFlow starts), which reports its peak RSS. ``--gpu``
runs the same configurations with a ``MirroredStrategy`` over the visible GPUs instead of logical
CPU devices.

    python benchmarks/large.py                       # writes benchmarks/results/large.md
    python benchmarks/large.py --rows 100000 --steps 20 --quick
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")

WORKER = r'''
import json, os, resource, sys, time
cfg = json.loads(sys.argv[1])
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf
if not cfg["gpu"] and cfg["replicas"] > 1:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * cfg["replicas"])
import numpy as np
import deepgp_gi as dg

info = dg.datasets.shard_info(cfg["shards"])
N, D = info["num_rows"], info["input_dim"]
if cfg["replicas"] > 1 or cfg["gpu"]:
    devices = None if cfg["gpu"] else [f"/cpu:{i}" for i in range(cfg["replicas"])]
    strategy = tf.distribute.MirroredStrategy(devices)
else:
    strategy = None
scope = strategy.scope() if strategy else tf.distribute.get_strategy().scope()
with scope:
    # the builder initialises from a first batch (k-means inducing inputs, PCA mean maps); the rest streams
    X0, Y0 = next(iter(dg.datasets.read_shards(cfg["shards"], min(N, 5000), shuffle=True, seed=0)))
    model = dg.build_deep_gp(X0.numpy(), Y0.numpy(), depth=cfg["depth"], posterior="mean_field",
                             num_inducing=cfg["M"], seed=0)
    model.num_data = N
    data = dg.datasets.read_shards(cfg["shards"], cfg["batch"], shuffle=True, seed=1)
    t0 = time.perf_counter()
    hist = dg.fit(model, data, steps=cfg["steps"], seed=0, progress=False, log_every=max(1, cfg["steps"] // 10),
                  strategy=strategy, natgrad_gamma=cfg["natgrad"])
    wall = time.perf_counter() - t0
est = dg.metrics.evaluate_dataset(model, dg.datasets.read_shards(cfg["shards"], 10000, shuffle=False).take(5),
                                  num_samples=20, progress=False)
points = cfg["steps"] * cfg["batch"]
print(json.dumps(dict(cfg, wall_s=wall, points_per_s=points / wall, epoch_s=N / (points / wall),
                      elbo_per_point=hist.elbo[-1] / N, elbo_trace=[e / N for e in hist.elbo],
                      test_ll_first_50k=est["test_ll"],
                      peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)))
'''


def make_shards(name: str, rows: int, folder: str, seed: int = 0) -> str:
    """Write (once) the shards of ``name``: ``generated`` (a smooth 8-D function plus noise, made in
    chunks of 10^5 rows) or a bundled UCI set; returns the shard folder."""
    import numpy as np

    import deepgp_gi as dg

    out = os.path.join(folder, f"{name}-{rows}" if name == "generated" else name)
    if os.path.exists(os.path.join(out, "shards.json")):
        return out
    if name == "generated":
        rng = np.random.default_rng(seed)
        X = rng.normal(size=(rows, 8))
        w = rng.normal(size=(8, 1)) / np.sqrt(8)
        Y = np.sin(2 * X @ w) + 0.3 * np.cos(X[:, :1] * X[:, 1:2]) + 0.1 * rng.normal(size=(rows, 1))
    else:
        X, Y, _ = dg.datasets.load_uci_raw(name)
        X = (X - X.mean(0)) / np.where(X.std(0) > 0, X.std(0), 1.0)
        Y = (Y - Y.mean(0)) / Y.std(0)
    dg.datasets.write_shards(X, Y, out, num_shards=max(1, min(32, len(X) // 20000)))
    return out


def run(cfg: dict) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1")
    out = subprocess.run([sys.executable, "-c", WORKER, json.dumps(cfg)], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--num-inducing", type=int, default=50)
    parser.add_argument("--gpu", action="store_true", help="MirroredStrategy over the visible GPUs")
    parser.add_argument("--shard-dir", default="/tmp/deepgp_gi_shards")
    parser.add_argument("--out", default=os.path.join(RESULTS, "large.md"))
    parser.add_argument("--quick", action="store_true", help="the generated set only")
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.dirname(HERE))

    sets = ["generated"] + ([] if args.quick else ["kin8nm", "protein"])
    t0 = time.perf_counter()
    folders = {name: make_shards(name, args.rows, args.shard_dir) for name in sets}
    write_s = time.perf_counter() - t0
    base = dict(depth=args.depth, M=args.num_inducing, batch=args.batch, steps=args.steps, gpu=args.gpu)
    rows = []
    for name in sets:
        batch = min(args.batch, 10_000 if name == "generated" else 2_000)
        variants = [(1, None), (2, None), (1, 0.1)] if name == "generated" else [(1, None), (1, 0.1)]
        if args.gpu:
            variants = [(0, None)]
        for replicas, natgrad in variants:
            cfg = dict(base, data=name, shards=folders[name], replicas=replicas, natgrad=natgrad, batch=batch)
            result = run(cfg)
            rows.append(result)
            print(json.dumps({k: v for k, v in result.items() if k != "elbo_trace"}), flush=True)
    command = "python " + " ".join(shlex.quote(a) for a in ["benchmarks/large.py"] + (argv or sys.argv[1:]))
    lines = [
        "# Large-data training from shards", "",
        f"Command: `{command}`. Shards written once in {write_s:.0f} s to `{args.shard_dir}`; each row "
        "below is its own process (peak RSS of that process). Depth "
        f"{args.depth} mean-field, M = {args.num_inducing}, {args.steps} Adam steps (or natural "
        "gradients with gamma = 0.1 on q(U) and Adam on the rest), 1 sample per step, streamed with "
        "`read_shards(shuffle=True)`. Epoch time is extrapolated from the measured points per second. "
        "Test LL on the first 50,000 rows (training rows: a fit diagnostic, not a generalisation test).", "",
        "| data | rows | batch | replicas | optimiser | points / s | epoch (s) | ELBO / point after budget | LL (first 50k) | peak RSS (MB) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        from deepgp_gi.datasets import shard_info  # noqa: E402

        n = shard_info(r["shards"])["num_rows"]
        opt = "Adam" if r["natgrad"] is None else f"natgrad {r['natgrad']:g} + Adam"
        lines.append(f"| {r['data']} | {n:,} | {r['batch']} | {r['replicas'] or 'GPUs'} | {opt} | "
                     f"{r['points_per_s']:,.0f} | {r['epoch_s']:.1f} | {r['elbo_per_point']:.3f} | "
                     f"{r['test_ll_first_50k']:.3f} | {r['peak_rss_mb']:.0f} |")
    with open(args.out, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
