"""Peak memory of a convolution's regression statistics G = X'^T Lambda X' and R = X'^T Lambda V:
the autocorrelation route of ``deepgp_gi.autocorrelation`` against explicit patch matrices.

Each measurement runs in a fresh Python process and reports the growth of its peak resident set
size (``ru_maxrss``) while computing G and R once (after a warm-up on tiny inputs, so TensorFlow's
own start-up is not counted). The patch route forms X' ``[M, H, W, k*k*C]``, ``k^2`` times the
images; the autocorrelation route never does, so its peak is the images, one lag table
``[C, 2k-1, 2k-1, C]`` and G itself (``(k^2 C)^2`` numbers).

    python benchmarks/conv_memory.py --out benchmarks/results/conv_memory.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, os, resource, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np, tensorflow as tf
from deepgp_gi.autocorrelation import patch_cross, patch_gram, patch_matrix
route, k, M, H, C, P = sys.argv[1], *map(int, sys.argv[2:7])
def run(M, H):
    rng = np.random.default_rng(0)
    X = tf.constant(rng.standard_normal((1, M, H, H, C)))
    V = tf.constant(rng.standard_normal((M, H, H, P)))
    lam = tf.ones([M], tf.float64)
    if route == "autocorrelation":
        G = patch_gram(X, lam, k, "same")
        R = patch_cross(X, V, lam, k, "same")
    else:
        Xp = patch_matrix(X[0], k, "same", boundary="circular")
        Xf = tf.reshape(Xp, [-1, Xp.shape[-1]])
        G = tf.matmul(Xf, Xf, transpose_a=True)
        R = tf.matmul(Xf, tf.reshape(V, [-1, P]), transpose_a=True)
    return float(tf.reduce_sum(G)) + float(tf.reduce_sum(R))
run(2, H)  # warm-up: kernels loaded, allocator primed
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
run(M, H)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"route": route, "k": k, "peak_growth_mb": (peak - base) / 1024.0}))
"""


def measure(route: str, k: int, M: int, H: int, C: int, P: int) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, route, str(k), str(M), str(H), str(C), str(P)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel-sizes", default="1,3,5,7,9")
    parser.add_argument("--num-images", type=int, default=200)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--channels", type=int, default=16)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    M, H, C, P = args.num_images, args.size, args.channels, args.channels
    image_mb = M * H * H * C * 8 / 2**20
    rows = []
    for k in map(int, args.kernel_sizes.split(",")):
        auto = measure("autocorrelation", k, M, H, C, P)["peak_growth_mb"]
        patch = measure("patches", k, M, H, C, P)["peak_growth_mb"]
        gram_mb = (k * k * C + 1) ** 2 * 8 / 2**20
        patch_mb = M * H * H * k * k * C * 8 / 2**20
        rows.append((k, auto, patch, gram_mb, patch_mb))
        print(
            f"k={k}: autocorrelation {auto:.1f} MB, patches {patch:.1f} MB (G {gram_mb:.1f} MB, "
            f"X' {patch_mb:.1f} MB)",
            flush=True,
        )
    lines = [
        "# Peak memory of G and R: autocorrelation against patch matrices",
        "",
        f"Command: `python benchmarks/conv_memory.py --kernel-sizes {args.kernel_sizes} "
        f"--num-images {M} --size {H} --channels {C}{' --out ' + args.out if args.out else ''}`",
        "",
        f"M = {M} inducing images of {H}x{H}x{C} (float64, {image_mb:.1f} MB), C_out = {P}, one "
        "sample. Peak growth of the process's resident set while computing G and R once, after a "
        "warm-up (fresh process per cell; resolution a few MB).",
        "",
        "| k | autocorrelation peak (MB) | patch-matrix peak (MB) | size of G (MB) | "
        "size of X' (MB) |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {k} | {a:.1f} | {p:.1f} | {g:.1f} | {x:.1f} |" for k, a, p, g, x in rows]
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
