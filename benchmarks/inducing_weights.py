"""1-D toy of Ritter et al. (2021) App. J.1: inducing weights against FFG-W and HMC/NUTS.

Set-up (ALGORITHMS.md §2.6; the paper's exact data recipe is not in our notes, so it is stated
here): N = 40 points, x ~ U(-1, 1), y = cos(4x) + N(0, 0.1^2); a 1 x 50 tanh network (weights
[2, 50] and [51, 1], biases included) with prior N(0, 4^2/d_in) (``NealPrior(sd=4)``); Gaussian
likelihood with the noise variance fixed at its true value 0.01. Methods:

* ``ffg_u`` -- FFG-U, M = 16 (the inducing weights are min(M, d_out) x min(M, d_in));
* ``ensemble_u`` -- Ensemble-U, M = 16, K = 8 members;
* ``factorised`` -- FFG-W (the library's factorised family, local reparameterisation);
* ``nuts`` -- the reference: TFP's No-U-Turn sampler on the same model (4 chains, dual-averaging
  step-size adaptation), XLA-compiled.

The variational methods run full-batch Adam (lr 1e-2, 8 Monte Carlo samples per step). For every
method the script records the predictive standard deviation of f on a grid over [-3, 3] (mean
inside the data range |x| <= 1, and far from it, 2 <= |x| <= 3), the test log-likelihood and RMSE
on 200 fresh points from the data distribution, the ELBO per data point (VI), wall time and the
number of variational parameters (``dg.parameter_count``), and writes
``results/inducing_weights.md`` (with the command) and ``results/inducing_weights.png``.

    nice -n 19 python benchmarks/inducing_weights.py              # defaults below
    nice -n 19 python benchmarks/inducing_weights.py --steps 500 --nuts-results 200   # smoke run
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gpflow  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_probability as tfp  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import deepgp_gi as dg  # noqa: E402
from deepgp_gi.priors import NealPrior  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
NOISE_STD = 0.1
PRIOR_SD = 4.0
HIDDEN = 50
VI_METHODS = ("ffg_u", "ensemble_u", "factorised")
LABELS = {"ffg_u": "FFG-U", "ensemble_u": "Ensemble-U", "factorised": "FFG-W", "nuts": "HMC (NUTS)"}


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              check=True).stdout.strip()
    except Exception:  # pragma: no cover
        return "unknown"


def make_data(seed: int, n: int = 40):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1.0, 1.0, size=(n, 1))
    Y = np.cos(4.0 * X) + NOISE_STD * rng.normal(size=(n, 1))
    return X, Y


def summarise(fs: np.ndarray, grid: np.ndarray, f_test: np.ndarray, Y_test: np.ndarray) -> dict:
    """fs: [S, G] function samples on the grid; f_test [S, T] on the test inputs."""
    std = fs.std(0)
    inside = np.abs(grid) <= 1.0
    far = np.abs(grid) >= 2.0
    var = NOISE_STD**2
    log_p = -0.5 * np.log(2 * np.pi * var) - 0.5 * (Y_test[None, :, 0] - f_test) ** 2 / var  # [S, T]
    m = log_p.max(0)
    lpd = m + np.log(np.mean(np.exp(log_p - m), 0))
    return dict(std_inside=float(std[inside].mean()), std_far=float(std[far].mean()),
                test_ll=float(lpd.mean()), rmse=float(np.sqrt(np.mean((f_test.mean(0) - Y_test[:, 0]) ** 2))),
                grid_mean=fs.mean(0), grid_std=std)


def run_vi(method: str, args, X, Y, grid, X_test, Y_test) -> dict:
    tf.random.set_seed(args.seed)
    lik = gpflow.likelihoods.Gaussian(variance=NOISE_STD**2)
    gpflow.set_trainable(lik, False)
    options = dict(num_inducing=args.num_inducing)
    if method == "ensemble_u":
        options["num_members"] = args.num_members
    model = dg.build_bnn(X, Y, hidden=(HIDDEN,), posterior=method, prior=NealPrior(sd=PRIOR_SD), activation="tanh",
                         likelihood=lik, seed=args.seed, **options)
    Xt, Yt = tf.constant(X), tf.constant(Y)
    opt = tf.optimizers.Adam(args.lr)
    variables = model.trainable_variables

    @tf.function
    def step(t):
        with tf.GradientTape() as tape:
            elbo = model.elbo((Xt, Yt), args.train_samples, seed=tf.stack([tf.constant(args.seed, tf.int64), t]))
            loss = -elbo
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return elbo

    t0 = time.perf_counter()
    for t in range(args.steps):
        elbo = step(tf.constant(t, tf.int64))
    train_time = time.perf_counter() - t0
    elbo = float(model.elbo((X, Y), 256, seed=12345).numpy())
    S = args.test_samples
    Xall = np.concatenate([grid[:, None], X_test])
    f = model.predict_f_samples(Xall, S, seed=777).numpy()[..., 0]  # [S, G + T]
    out = summarise(f[:, : len(grid)], grid, f[:, len(grid):], Y_test)
    out.update(method=method, elbo_per_point=elbo / len(X), seconds=train_time,
               params=dg.parameter_count(model), model=model)
    return out


def run_nuts(args, X, Y, grid, X_test, Y_test) -> dict:
    dtype = tf.float64
    d0, d1 = 2, HIDDEN + 1
    sd0, sd1 = PRIOR_SD / np.sqrt(d0), PRIOR_SD / np.sqrt(d1)
    Xt, Yt = tf.constant(X), tf.constant(Y)
    n0 = d0 * HIDDEN

    def unpack(theta):  # [C, n] -> weights
        W0 = tf.reshape(theta[:, :n0], [-1, d0, HIDDEN])
        W1 = tf.reshape(theta[:, n0:], [-1, d1, 1])
        return W0, W1

    def forward(theta, Xin):
        W0, W1 = unpack(theta)
        ones = tf.ones_like(Xin[:, :1])
        H = tf.tanh(tf.einsum("nd,cdh->cnh", tf.concat([Xin, ones], 1), W0))
        H = tf.concat([H, tf.ones_like(H[..., :1])], -1)
        return tf.einsum("cnh,cho->cno", H, W1)[..., 0]  # [C, N]

    def log_prob(theta):
        W0, W1 = unpack(theta)
        lp = -0.5 * tf.reduce_sum(tf.square(W0), [1, 2]) / sd0**2 - 0.5 * tf.reduce_sum(tf.square(W1), [1, 2]) / sd1**2
        resid = Yt[None, :, 0] - forward(theta, Xt)
        return lp - 0.5 * tf.reduce_sum(tf.square(resid), 1) / NOISE_STD**2

    n = n0 + d1
    rng = np.random.default_rng(args.seed)
    init = np.concatenate([rng.normal(size=(args.chains, n0)) * sd0, rng.normal(size=(args.chains, d1)) * sd1], 1)
    kernel = tfp.mcmc.NoUTurnSampler(log_prob, step_size=tf.constant(0.01, dtype), max_tree_depth=args.max_tree_depth)
    kernel = tfp.mcmc.DualAveragingStepSizeAdaptation(kernel, num_adaptation_steps=int(0.8 * args.nuts_burnin),
                                                      target_accept_prob=tf.constant(0.8, dtype))

    @tf.function(jit_compile=True)
    def sample():
        return tfp.mcmc.sample_chain(args.nuts_results, tf.constant(init, dtype), kernel=kernel,
                                     num_burnin_steps=args.nuts_burnin, trace_fn=lambda _, r: r.inner_results.log_accept_ratio,
                                     seed=tf.constant([args.seed, 3], tf.int32))

    t0 = time.perf_counter()
    thetas, accepted = sample()
    seconds = time.perf_counter() - t0
    thetas = tf.reshape(thetas, [-1, n])  # [R * C, n]
    Xall = np.concatenate([grid[:, None], X_test])
    f = forward(thetas, tf.constant(Xall)).numpy()
    out = summarise(f[:, : len(grid)], grid, f[:, len(grid):], Y_test)
    rhat = tfp.mcmc.potential_scale_reduction(
        tf.reshape(tf.constant(f[:, len(grid):][:, :20]), [args.nuts_results, args.chains, 20])).numpy()
    out.update(method="nuts", seconds=seconds, acceptance=float(np.mean(np.exp(np.minimum(accepted.numpy(), 0.0)))), max_rhat_test_f=float(rhat.max()),
               params=None, elbo_per_point=None)
    return out


def plot(results, X, Y, grid, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.2), sharey=True)
    for ax, r in zip(axes, results):
        m, s = r["grid_mean"], r["grid_std"]
        ax.fill_between(grid, m - 2 * s, m + 2 * s, alpha=0.3)
        ax.plot(grid, m)
        ax.plot(X[:, 0], Y[:, 0], "k.", ms=3)
        ax.set_title(LABELS[r["method"]])
        ax.set_ylim(-4, 4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--train-samples", type=int, default=8)
    p.add_argument("--test-samples", type=int, default=400)
    p.add_argument("--num-inducing", type=int, default=16)
    p.add_argument("--num-members", type=int, default=8)
    p.add_argument("--chains", type=int, default=4)
    p.add_argument("--nuts-burnin", type=int, default=1000)
    p.add_argument("--nuts-results", type=int, default=1000)
    p.add_argument("--max-tree-depth", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--methods", default=",".join(VI_METHODS + ("nuts",)))
    p.add_argument("--out", default=str(RESULTS / "inducing_weights.md"))
    args = p.parse_args(argv)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)

    X, Y = make_data(args.seed)
    X_test, Y_test = make_data(args.seed + 1, 200)
    grid = np.linspace(-3.0, 3.0, 121)
    results = []
    t_all = time.perf_counter()
    for method in args.methods.split(","):
        if method == "nuts":
            r = run_nuts(args, X, Y, grid, X_test, Y_test)
        else:
            r = run_vi(method, args, X, Y, grid, X_test, Y_test)
        print(f"{method}: std inside {r['std_inside']:.3f}, far {r['std_far']:.3f}, test LL {r['test_ll']:.3f}, "
              f"{r['seconds']:.1f}s", flush=True)
        results.append(r)
    total = time.perf_counter() - t_all

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    png = out.with_suffix(".png")
    plot(results, X, Y, grid, png)
    command = "nice -n 19 python benchmarks/inducing_weights.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    lines = [
        "# Inducing weights: 1-D toy (Ritter et al. 2021, App. J.1)",
        "",
        f"Command: `{command.strip()}` (commit {_git_commit()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"one CPU thread, total {total:.0f} s).",
        "",
        f"Data: 40 points, x ~ U(-1, 1), y = cos(4x) + N(0, {NOISE_STD}^2); 1 x {HIDDEN} tanh BNN, prior "
        f"N(0, {PRIOR_SD:g}^2/d_in), noise variance fixed at {NOISE_STD**2:g}. VI: Adam lr {args.lr}, {args.steps} "
        f"full-batch steps, {args.train_samples} samples/step, M = {args.num_inducing}, K = {args.num_members}; "
        f"predictions from {args.test_samples} samples. NUTS: {args.chains} chains x {args.nuts_results} draws after "
        f"{args.nuts_burnin} burn-in steps, max tree depth {args.max_tree_depth}.",
        "",
        "std(f) is the predictive standard deviation of f, averaged over the grid points inside the data range "
        "(|x| <= 1) and far from it (2 <= |x| <= 3); test LL and RMSE on 200 fresh points from the data distribution.",
        "",
        "| method | std(f) inside | std(f) far | far / inside | test LL | RMSE | ELBO / point | variational params | time (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        elbo = "" if r["elbo_per_point"] is None else f"{r['elbo_per_point']:.3f}"
        params = "" if r["params"] is None else f"{r['params']:,}"
        lines.append(f"| {LABELS[r['method']]} | {r['std_inside']:.3f} | {r['std_far']:.3f} | "
                     f"{r['std_far'] / r['std_inside']:.1f} | {r['test_ll']:.3f} | {r['rmse']:.3f} | {elbo} | {params} | "
                     f"{r['seconds']:.1f} |")
    nuts = [r for r in results if r["method"] == "nuts"]
    if nuts:
        lines += ["", f"NUTS: mean acceptance probability {nuts[0]['acceptance']:.2f}, max R-hat of f at 20 test inputs "
                      f"{nuts[0]['max_rhat_test_f']:.3f}."]
    models = {LABELS[r["method"]]: r["model"] for r in results if "model" in r}
    if models:
        lines += ["", "Variational parameters per layer (`dg.parameter_table`):", "",
                  dg.parameter_table(models, reference="FFG-W" if "FFG-W" in models else None)]
    # The Table 9 style comparison on a wide network (built, not trained).
    rng = np.random.default_rng(0)
    Xw, Yw = rng.normal(size=(4, 1024)), rng.normal(size=(4, 1))
    wide = {"FFG-W": dg.build_bnn(Xw, Yw, hidden=(1024,), posterior="factorised", seed=0)}
    for M in (64, 128):
        wide[f"FFG-U M={M}"] = dg.build_bnn(Xw, Yw, hidden=(1024,), posterior="ffg_u", num_inducing=M, seed=0)
        wide[f"Ensemble-U M={M} K=5"] = dg.build_bnn(Xw, Yw, hidden=(1024,), posterior="ensemble_u", num_inducing=M,
                                                    seed=0)
    wide["Ensemble-W K=5"] = dg.build_bnn(Xw, Yw, hidden=(1024,), posterior="ensemble_w", seed=0)
    lines += ["", "Parameter counts of a 1024-1024-1 network (in the style of Ritter et al. Table 9):", "",
              dg.parameter_table(wide, reference="FFG-W"), "", f"Plot: `{png.name}` (mean +- 2 std of f).", ""]
    out.write_text("\n".join(lines))
    print(out.read_text())


if __name__ == "__main__":
    main()
