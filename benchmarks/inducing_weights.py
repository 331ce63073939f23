"""1-D toy of Ritter et al. (2021) App. J.1: inducing weights against FFG-W and HMC/NUTS.

Set-up (docs/algorithms.md, "Inducing weights"; the paper's exact data recipe was not available to
us, so ours is stated here):
N = 40 points, x ~ U(-1, 1), y = cos(4x) + N(0, 0.1^2); a 1 x 50 tanh network (weights
[2, 50] and [51, 1], biases included) with prior N(0, 4^2/d_in) (``NealPrior(sd=4)``); Gaussian
likelihood with the noise variance fixed at its true value 0.01. Methods:

* ``ffg_u`` -- FFG-U, M = 16 (the inducing weights are min(M, d_out) x min(M, d_in));
* ``ensemble_u`` -- Ensemble-U, M = 16, K = 8 members;
* ``factorised`` -- FFG-W (the library's factorised family, local reparameterisation);
* ``nuts`` -- the reference: TFP's No-U-Turn sampler on the same model (4 chains, dual-averaging
  step-size adaptation), XLA-compiled.

The variational methods run full-batch Adam (lr 1e-2, 8 Monte Carlo samples per step, 24,000 steps:
FFG-U's ELBO and far/inside std ratio are still rising at 16,000, see ``toy-settings``). For every
method the script records the predictive standard deviation of f on a grid over [-3, 3] (mean
inside the data range |x| <= 1, and far from it, 2 <= |x| <= 3), the test log-likelihood and RMSE
on 200 fresh points from the data distribution, the ELBO per data point (VI), wall time and the
number of variational parameters (``dg.parameter_count``), and writes
``results/inducing_weights.md`` (with the command) and ``results/inducing_weights.png``.

    nice -n 19 python benchmarks/inducing_weights.py              # defaults below
    nice -n 19 python benchmarks/inducing_weights.py --steps 500 --nuts-results 200   # smoke run

Subcommands (the first argument; without one the script runs the toy above):

* ``digits`` -- classification on the bundled 8x8 digits (:func:`digits_main`): FFG-U,
  Ensemble-U, FFG-W and Ensemble-W on a dense net, one JSON line per (method, seed) cell
  appended to ``results/inducing_weights_digits.jsonl`` (cells already there are skipped) and
  the table ``results/inducing_weights_digits.md`` rewritten from all the lines;

      nice -n 19 python benchmarks/inducing_weights.py digits

* ``toy-settings`` -- the toy's far/inside predictive std ratio for FFG-U, FFG-W and Ensemble-U
  under the settings of :data:`TOY_SETTINGS` (the defaults at several training lengths, Ritter's
  caps, M = 50, App. J's training recipe), against NUTS (computed once and cached in the JSON
  lines): ``results/inducing_weights_toy_settings.{jsonl,md}``.

      nice -n 19 python benchmarks/inducing_weights.py toy-settings --seeds 0
"""

from __future__ import annotations

if not __package__:  # run by path: load benchmarks/ as the package (benchmarks/_by_path.py)
    import _by_path  # noqa: F401  (imported for its side effect)

import argparse
import math
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
import tensorflow_probability as tfp

import deepgp_gi as dg
from benchmarks.common import append_line, code_commit, mean_se, read_lines, set_threads
from deepgp_gi.priors import NealPrior

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
NOISE_STD = 0.1
PRIOR_SD = 4.0
HIDDEN = 50
VI_METHODS = ("ffg_u", "ensemble_u", "factorised")
LABELS = {"ffg_u": "FFG-U", "ensemble_u": "Ensemble-U", "factorised": "FFG-W", "nuts": "HMC (NUTS)"}


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
    log_p = (
        -0.5 * np.log(2 * np.pi * var) - 0.5 * (Y_test[None, :, 0] - f_test) ** 2 / var
    )  # [S, T]
    m = log_p.max(0)
    lpd = m + np.log(np.mean(np.exp(log_p - m), 0))
    return dict(
        std_inside=float(std[inside].mean()),
        std_far=float(std[far].mean()),
        test_ll=float(lpd.mean()),
        rmse=float(np.sqrt(np.mean((f_test.mean(0) - Y_test[:, 0]) ** 2))),
        grid_mean=fs.mean(0),
        grid_std=std,
    )


def build_toy_model(method: str, X, Y, seed: int, num_inducing: int, num_members: int, **options):
    lik = gpflow.likelihoods.Gaussian(variance=NOISE_STD**2)
    gpflow.set_trainable(lik, False)
    if method in ("ffg_u", "ensemble_u"):
        options["num_inducing"] = num_inducing
    if method in ("ensemble_u", "ensemble_w"):
        options["num_members"] = num_members
    return dg.build_bnn(
        X,
        Y,
        hidden=(HIDDEN,),
        posterior=method,
        prior=NealPrior(sd=PRIOR_SD),
        activation="tanh",
        likelihood=lik,
        seed=seed,
        **options,
    )


def train_vi(
    model,
    X,
    Y,
    *,
    seed: int,
    checkpoints,
    lr: float,
    train_samples: int,
    kl_schedule=None,
    lr_decay_at=None,
):
    """Full-batch Adam on ``E[log p(Y|F)] - beta_t KL`` (``beta_t = kl_schedule(t)``, 1 without a
    schedule: the ELBO), noise seeded by ``(seed, t)``; the learning rate is divided by 10 from
    step ``lr_decay_at`` on. Yields ``(steps done, training seconds)`` at each checkpoint."""
    Xt, Yt = tf.constant(X), tf.constant(Y)
    opt = tf.optimizers.Adam(lr)
    variables = model.trainable_variables
    beta = tf.Variable(1.0, dtype=model.dtype, trainable=False)

    @tf.function
    def step(t):
        with tf.GradientTape() as tape:
            ell, kl = model.elbo_terms(
                (Xt, Yt), train_samples, seed=tf.stack([tf.constant(seed, tf.int64), t])
            )
            loss = -tf.reduce_mean(ell - beta * kl)
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    seconds, t = 0.0, 0
    for stop in sorted(checkpoints):
        t0 = time.perf_counter()
        while t < stop:
            if kl_schedule is not None:
                beta.assign(kl_schedule(t))
            if lr_decay_at is not None and t == lr_decay_at:
                opt.learning_rate.assign(lr / 10)
            step(tf.constant(t, tf.int64))
            t += 1
        seconds += time.perf_counter() - t0
        yield t, seconds


def evaluate_vi(model, X, Y, grid, X_test, Y_test, test_samples: int) -> dict:
    elbo = float(model.elbo((X, Y), 256, seed=12345).numpy())
    Xall = np.concatenate([grid[:, None], X_test])
    f = model.predict_f_samples(Xall, test_samples, seed=777).numpy()[..., 0]  # [S, G + T]
    out = summarise(f[:, : len(grid)], grid, f[:, len(grid) :], Y_test)
    out.update(elbo_per_point=elbo / len(X), params=dg.parameter_count(model))
    return out


def run_vi(method: str, args, X, Y, grid, X_test, Y_test) -> dict:
    tf.random.set_seed(args.seed)
    model = build_toy_model(method, X, Y, args.seed, args.num_inducing, args.num_members)
    for _, train_time in train_vi(
        model,
        X,
        Y,
        seed=args.seed,
        checkpoints=[args.steps],
        lr=args.lr,
        train_samples=args.train_samples,
    ):
        pass
    out = evaluate_vi(model, X, Y, grid, X_test, Y_test, args.test_samples)
    out.update(method=method, seconds=train_time, model=model)
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
        lp = (
            -0.5 * tf.reduce_sum(tf.square(W0), [1, 2]) / sd0**2
            - 0.5 * tf.reduce_sum(tf.square(W1), [1, 2]) / sd1**2
        )
        resid = Yt[None, :, 0] - forward(theta, Xt)
        return lp - 0.5 * tf.reduce_sum(tf.square(resid), 1) / NOISE_STD**2

    n = n0 + d1
    rng = np.random.default_rng(args.seed)
    init = np.concatenate(
        [rng.normal(size=(args.chains, n0)) * sd0, rng.normal(size=(args.chains, d1)) * sd1], 1
    )
    kernel = tfp.mcmc.NoUTurnSampler(
        log_prob, step_size=tf.constant(0.01, dtype), max_tree_depth=args.max_tree_depth
    )
    kernel = tfp.mcmc.DualAveragingStepSizeAdaptation(
        kernel,
        num_adaptation_steps=int(0.8 * args.nuts_burnin),
        target_accept_prob=tf.constant(0.8, dtype),
    )

    @tf.function(jit_compile=True)
    def sample():
        return tfp.mcmc.sample_chain(
            args.nuts_results,
            tf.constant(init, dtype),
            kernel=kernel,
            num_burnin_steps=args.nuts_burnin,
            trace_fn=lambda _, r: r.inner_results.log_accept_ratio,
            seed=tf.constant([args.seed, 3], tf.int32),
        )

    t0 = time.perf_counter()
    thetas, accepted = sample()
    seconds = time.perf_counter() - t0
    thetas = tf.reshape(thetas, [-1, n])  # [R * C, n]
    Xall = np.concatenate([grid[:, None], X_test])
    f = forward(thetas, tf.constant(Xall)).numpy()
    out = summarise(f[:, : len(grid)], grid, f[:, len(grid) :], Y_test)
    rhat = tfp.mcmc.potential_scale_reduction(
        tf.reshape(tf.constant(f[:, len(grid) :][:, :20]), [args.nuts_results, args.chains, 20])
    ).numpy()
    out.update(
        method="nuts",
        seconds=seconds,
        acceptance=float(np.mean(np.exp(np.minimum(accepted.numpy(), 0.0)))),
        max_rhat_test_f=float(rhat.max()),
        params=None,
        elbo_per_point=None,
    )
    return out


#: Method -> BNN family whose colour it is drawn in (HMC, the reference, in black).
FAMILY_OF = {"ffg_u": "ffg_u", "ensemble_u": "ensemble_u", "factorised": "factorised"}


def plot(results, X, Y, grid, path):
    """A panel per method: the predictive mean of f and ± 2 SD of f on the grid (the family's
    colour; HMC, the reference, black), the training points, the data range shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks import plot_style

    fig, axes = plt.subplots(
        1, len(results), figsize=(4 * len(results), 3.4), sharey=True, squeeze=False
    )
    for ax, r in zip(axes[0], results):
        family = FAMILY_OF.get(r["method"])
        colour = plot_style.family_colour(family, "bnn") if family else plot_style.REFERENCE_COLOUR
        m, s = np.asarray(r["grid_mean"]), np.asarray(r["grid_std"])
        for edge in (-1, 1):
            ax.axvline(edge, color="0.55", ls=":", lw=1)
        ax.fill_between(
            grid, m - 2 * s, m + 2 * s, color=colour, alpha=0.25, lw=0, label="mean ± 2 SD of f"
        )
        ax.plot(grid, m, color=colour, label="predictive mean of f")
        ax.plot(X[:, 0], Y[:, 0], "k.", ms=3, label="training points")
        ax.set_title(LABELS[r["method"]] + (f" ({family})" if family else " (reference)"))
        ax.set_xlabel("x")
        ax.set_ylim(-4, 4)
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("f(x), y")
    handles = [
        plt.Line2D([], [], color="0.55", ls=":", lw=1, label="edges of the training inputs"),
        plt.Rectangle((0, 0), 1, 1, color="0.5", alpha=0.4, label="mean ± 2 SD of f"),
        plt.Line2D([], [], color="0.3", label="predictive mean of f"),
        plt.Line2D([], [], color="k", marker=".", ls="", label="training points"),
    ]
    fig.tight_layout()
    plot_style.legend_outside(fig, handles=handles, where="below", ncol=4, fontsize=9)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--steps", type=int, default=24000
    )  # FFG-U is far from converged at 4000 (toy-settings)
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
    set_threads(1)

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
        print(
            f"{method}: std inside {r['std_inside']:.3f}, far {r['std_far']:.3f}, test LL "
            f"{r['test_ll']:.3f}, {r['seconds']:.1f}s",
            flush=True,
        )
        results.append(r)
    total = time.perf_counter() - t_all

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    png = out.with_suffix(".png")
    plot(results, X, Y, grid, png)
    command = "nice -n 19 python benchmarks/inducing_weights.py " + " ".join(
        shlex.quote(a) for a in (argv or sys.argv[1:])
    )
    lines = [
        "# Inducing weights: 1-D toy (Ritter et al. 2021, App. J.1)",
        "",
        f"Command: `{command.strip()}` (commit {code_commit()}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, one CPU thread, "
        f"total {total:.0f} s).",
        "",
        f"Data: 40 points, x ~ U(-1, 1), y = cos(4x) + N(0, {NOISE_STD}^2); 1 x {HIDDEN} tanh "
        f"BNN, prior N(0, {PRIOR_SD:g}^2/d_in), noise variance fixed at {NOISE_STD**2:g}. VI: "
        f"Adam lr {args.lr}, {args.steps} full-batch steps, {args.train_samples} samples/step, M "
        f"= {args.num_inducing}, K = {args.num_members}; predictions from {args.test_samples} "
        f"samples. NUTS: {args.chains} chains x {args.nuts_results} draws after "
        f"{args.nuts_burnin} burn-in steps, max tree depth {args.max_tree_depth}.",
        "",
        "std(f) is the predictive standard deviation of f, averaged over the grid points inside "
        "the data range (|x| <= 1) and far from it (2 <= |x| <= 3); test LL and RMSE on 200 fresh "
        "points from the data distribution.",
        "",
        "| method | std(f) inside | std(f) far | far / inside | test LL | RMSE | ELBO / point | "
        "variational params | time (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        elbo = "" if r["elbo_per_point"] is None else f"{r['elbo_per_point']:.3f}"
        params = "" if r["params"] is None else f"{r['params']:,}"
        lines.append(
            f"| {LABELS[r['method']]} | {r['std_inside']:.3f} | {r['std_far']:.3f} | "
            f"{r['std_far'] / r['std_inside']:.1f} | {r['test_ll']:.3f} | {r['rmse']:.3f} | "
            f"{elbo} | {params} | {r['seconds']:.1f} |"
        )
    nuts = [r for r in results if r["method"] == "nuts"]
    if nuts:
        lines += [
            "",
            f"NUTS: mean acceptance probability {nuts[0]['acceptance']:.2f}, max R-hat of f at 20 "
            f"test inputs {nuts[0]['max_rhat_test_f']:.3f}.",
        ]
    models = {LABELS[r["method"]]: r["model"] for r in results if "model" in r}
    if models:
        lines += [
            "",
            "Variational parameters per layer (`dg.parameter_table`):",
            "",
            dg.parameter_table(models, reference="FFG-W" if "FFG-W" in models else None),
        ]
    # The Table 9 style comparison on a wide network (built, not trained).
    rng = np.random.default_rng(0)
    Xw, Yw = rng.normal(size=(4, 1024)), rng.normal(size=(4, 1))
    wide = {"FFG-W": dg.build_bnn(Xw, Yw, hidden=(1024,), posterior="factorised", seed=0)}
    for M in (64, 128):
        wide[f"FFG-U M={M}"] = dg.build_bnn(
            Xw, Yw, hidden=(1024,), posterior="ffg_u", num_inducing=M, seed=0
        )
        wide[f"Ensemble-U M={M} K=5"] = dg.build_bnn(
            Xw, Yw, hidden=(1024,), posterior="ensemble_u", num_inducing=M, seed=0
        )
    wide["Ensemble-W K=5"] = dg.build_bnn(Xw, Yw, hidden=(1024,), posterior="ensemble_w", seed=0)
    lines += [
        "",
        "Parameter counts of a 1024-1024-1 network (in the style of Ritter et al. Table 9):",
        "",
        dg.parameter_table(wide, reference="FFG-W"),
        "",
        f"Plot: `{png.name}` (mean +- 2 std of f).",
        "",
    ]
    out.write_text("\n".join(lines))
    print(out.read_text())


# --------------------------------------------------------------------------- toy settings
#: The settings of ``toy-settings``: the benchmark's defaults and the paper's choices changed one
#: group at a time (docs/algorithms.md, "Inducing weights", "Initial values and settings").
#: ``checkpoints``: the training lengths evaluated (one run
#: evaluated along the way, so the 4000-step row is the 4000-step benchmark); a setting whose
#: schedules depend on the run's length has one checkpoint.
TOY_SETTINGS = {
    "defaults": dict(
        desc=(
            "the toy's defaults: M = 16, lambda_max = sigma_max = 1, Adam 1e-2, 8 samples/step, "
            "ELBO from step 0"
        ),
        methods=("ffg_u", "ensemble_u", "factorised"),
        checkpoints=(4000, 8000, 16000, 24000),
    ),
    "long": dict(
        desc="the defaults trained longer: FFG-U's ratio is still rising at 24,000 steps",
        methods=("ffg_u",),
        checkpoints=(48000, 96000),
    ),
    "cifar_caps": dict(
        desc=(
            "Ritter's CIFAR-10 caps: lambda_max = 0.03 and sigma_max = 0.1 (FFG-U), lambda_max = "
            "0.1 (Ensemble-U)"
        ),
        methods=("ffg_u", "ensemble_u"),
        checkpoints=(4000, 24000),
        options={"ffg_u": dict(lambda_max=0.03, sd_max=0.1), "ensemble_u": dict(lambda_max=0.1)},
    ),
    "full_rank_m50": dict(
        desc=(
            "M = 50 = the hidden width (U is 50 x 2 and 1 x 50: q(W|U) has (almost) no residual "
            "variance)"
        ),
        methods=("ffg_u", "ensemble_u"),
        checkpoints=(4000, 24000),
        num_inducing=50,
    ),
    "paper_training": dict(
        desc="App. J's training recipe: 1 sample/step, no KL for the first third of the steps, "
        "linear KL annealing over the next sixth, learning rate / 10 for the last third",
        methods=("ffg_u", "ensemble_u", "factorised"),
        checkpoints=(24000,),
        train_samples=1,
        kl="ritter",
        lr_decay=True,
    ),
}


def toy_settings_main(argv):
    p = argparse.ArgumentParser(
        prog="inducing_weights.py toy-settings",
        description="The toy's far/inside std ratio under the paper's settings.",
    )
    p.add_argument("--settings", default=",".join(TOY_SETTINGS))
    p.add_argument("--seeds", default="0", help="model seeds (the data are always make_data(0))")
    p.add_argument(
        "--max-steps", type=int, default=None, help="drop checkpoints above this (a cheaper seed)"
    )
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--train-samples", type=int, default=8)
    p.add_argument("--test-samples", type=int, default=400)
    p.add_argument("--num-inducing", type=int, default=16)
    p.add_argument("--num-members", type=int, default=8)
    p.add_argument("--nuts-burnin", type=int, default=1000)
    p.add_argument("--nuts-results", type=int, default=1000)
    p.add_argument("--out", default=str(RESULTS / "inducing_weights_toy_settings.jsonl"))
    args = p.parse_args(argv)
    argv_all = ["toy-settings"] + list(argv)
    set_threads(1)
    out = Path(args.out)
    rows = read_lines(args.out)
    done = {(r["setting"], r["method"], r["seed"], r["steps"]) for r in rows}
    command = "python benchmarks/inducing_weights.py " + " ".join(shlex.quote(a) for a in argv_all)
    X, Y = make_data(0)
    X_test, Y_test = make_data(1, 200)
    grid = np.linspace(-3.0, 3.0, 121)

    def append(row):
        row.update(commit=code_commit(), command=command)
        row.pop("grid_mean", None)
        row.pop("grid_std", None)
        append_line(args.out, row)
        rows.append(row)
        done.add((row["setting"], row["method"], row["seed"], row["steps"]))
        print(
            f"{row['setting']} {row['method']} seed {row['seed']} steps {row['steps']}: ratio "
            f"{row['std_far'] / row['std_inside']:.2f} (inside {row['std_inside']:.3f}, far "
            f"{row['std_far']:.3f}), ELBO/N {row['elbo_per_point']}, {row['seconds']:.0f}s",
            flush=True,
        )

    nuts_args = argparse.Namespace(
        chains=4,
        nuts_burnin=args.nuts_burnin,
        nuts_results=args.nuts_results,
        max_tree_depth=8,
        seed=0,
    )
    if ("reference", "nuts", 0, None) not in done:  # computed once, then read from the file
        r = run_nuts(nuts_args, X, Y, grid, X_test, Y_test)
        append(
            dict(
                setting="reference",
                method="nuts",
                seed=0,
                steps=None,
                std_inside=r["std_inside"],
                std_far=r["std_far"],
                test_ll=r["test_ll"],
                rmse=r["rmse"],
                elbo_per_point=None,
                acceptance=r["acceptance"],
                max_rhat_test_f=r["max_rhat_test_f"],
                seconds=r["seconds"],
                nuts_burnin=args.nuts_burnin,
                nuts_results=args.nuts_results,
            )
        )
    for name in args.settings.split(","):
        setting = TOY_SETTINGS[name]
        checkpoints = [
            c for c in setting["checkpoints"] if args.max_steps is None or c <= args.max_steps
        ]
        if not checkpoints:  # a single-checkpoint setting shortened to --max-steps
            checkpoints = [args.max_steps]
        total = max(checkpoints)
        train_samples = setting.get("train_samples", args.train_samples)
        M = setting.get("num_inducing", args.num_inducing)
        for seed in map(int, args.seeds.split(",")):
            for method in setting["methods"]:
                if all((name, method, seed, c) in done for c in checkpoints):
                    print(f"skip {name} {method} seed {seed}", flush=True)
                    continue
                options = dict(setting.get("options", {}).get(method, {}))
                tf.random.set_seed(seed)
                model = build_toy_model(method, X, Y, seed, M, args.num_members, **options)
                kl = ritter_schedule(total) if setting.get("kl") == "ritter" else None
                decay = (2 * total) // 3 if setting.get("lr_decay") else None
                for steps, seconds in train_vi(
                    model,
                    X,
                    Y,
                    seed=seed,
                    checkpoints=checkpoints,
                    lr=args.lr,
                    train_samples=train_samples,
                    kl_schedule=kl,
                    lr_decay_at=decay,
                ):
                    if (name, method, seed, steps) in done:
                        continue
                    r = evaluate_vi(model, X, Y, grid, X_test, Y_test, args.test_samples)
                    post = model.posterior
                    r.update(
                        setting=name,
                        method=method,
                        seed=seed,
                        steps=steps,
                        seconds=seconds,
                        lr=args.lr,
                        train_samples=train_samples,
                        test_samples=args.test_samples,
                        num_inducing=M,
                        num_members=args.num_members,
                        options=options,
                        kl_schedule=setting.get("kl"),
                        lr_decay_at=decay,
                        lam=[float(iw.lam.numpy()) for iw in getattr(post, "inducing_weights", [])],
                        u_sd_median=[
                            float(np.median(sd.numpy())) for sd in getattr(post, "u_sds", [])
                        ],
                    )
                    append(r)
    md = out.with_suffix(".md")
    text = with_notes(toy_settings_report(rows, command), md.read_text() if md.exists() else "")
    md.write_text(text)
    print(text)


def _commands(rows, command: str):
    """Markdown bullets of the distinct commands that produced ``rows`` (first use first), each with
    its commits, and the current one."""
    commits = {}
    for r in rows:
        cmd = (
            r["command"].replace("python benchmarks/", "nice -n 19 python benchmarks/", 1)
            if not r["command"].startswith("nice")
            else r["command"]
        )
        commits.setdefault(cmd, [])
        if r.get("commit") not in commits[cmd]:
            commits[cmd].append(r.get("commit"))
    if not command.startswith("nice"):
        command = "nice -n 19 " + command
    commits.setdefault(command, [])
    return [
        f"* `{c}`" + (f" (commit {', '.join(map(str, k))})" if k else "")
        for c, k in commits.items()
    ]


def _spread(values, digits=1) -> str:
    """``mean`` for one value, ``mean [min, max]`` for several."""
    values = np.asarray(values, float)
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{values.mean():.{digits}f} [{values.min():.{digits}f}, {values.max():.{digits}f}]"


def toy_settings_report(rows, command: str) -> str:
    nuts = [r for r in rows if r["method"] == "nuts"]
    vi = [r for r in rows if r["method"] != "nuts"]
    groups = {}
    for r in vi:
        groups.setdefault((r["setting"], r["steps"], r["method"]), []).append(r)
    order = {n: i for i, n in enumerate(TOY_SETTINGS)}
    keys = sorted({(k[0], k[1]) for k in groups}, key=lambda k: (order.get(k[0], 99), k[1]))
    methods = ("ffg_u", "factorised", "ensemble_u")
    nuts_ratio = f"{nuts[0]['std_far'] / nuts[0]['std_inside']:.1f}" if nuts else ""
    lines = [
        "# Inducing weights: the toy's far / inside predictive std under the paper's settings",
        "",
        "Commands (`nice -n 19` on a shared 2-core machine; resumable: cells already in the JSON "
        "lines are skipped; every line records its command and commit):",
        "",
        *_commands(rows, command),
        "",
        "Same toy as `inducing_weights.md` (data `make_data(0)`, 1 x 50 tanh, prior N(0, "
        "4^2/d_in), noise variance 0.01 fixed); the ratio is std(f) averaged over 2 <= |x| <= 3 "
        f"divided by std(f) averaged over |x| <= 1, from {vi[0]['test_samples'] if vi else ''} "
        "predictive samples. One training run per (setting, method, seed) is evaluated at each "
        "listed number of steps. Several seeds: mean [min, max] over model seeds (n). The NUTS "
        "reference (4 chains, dual-averaging step size, max tree depth 8"
        + (
            f", {nuts[0]['nuts_results']} draws per chain after {nuts[0]['nuts_burnin']} burn-in "
            "steps"
            if nuts
            else ""
        )
        + ") is computed once and read back from the JSON lines.",
        "",
        "Settings:",
        "",
    ]
    lines += [
        f"* `{n}`: {TOY_SETTINGS[n]['desc']}." for n in TOY_SETTINGS if any(k[0] == n for k in keys)
    ]
    lines += [
        "",
        "| setting | steps | FFG-U | FFG-W | Ensemble-U | HMC (NUTS) |",
        "|---|---|---|---|---|---|",
    ]
    for setting, steps in keys:
        cells = []
        for m in methods:
            g = groups.get((setting, steps, m))
            cells.append(
                ""
                if not g
                else _spread([r["std_far"] / r["std_inside"] for r in g])
                + ("" if len(g) == 1 else f" (n={len(g)})")
            )
        lines.append(f"| {setting} | {steps} | " + " | ".join(cells) + f" | {nuts_ratio} |")
    lines += [
        "",
        "All cells (std inside / far, test LL and RMSE on 200 fresh points, ELBO per point; "
        "lambda and the median whitened sd of q(U) per layer (FFG-U), lambda per layer (both U "
        "families); Ensemble-U's 'ELBO' has no U-term):",
        "",
        "| setting | steps | method | seed | std inside | std far | far / inside | test LL | "
        "RMSE | ELBO / point | lambda | median sd(U) | time (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in nuts:
        lines.append(
            f"| reference | | HMC (NUTS) | {r['seed']} | {r['std_inside']:.3f} | "
            f"{r['std_far']:.3f} | {r['std_far'] / r['std_inside']:.1f} | {r['test_ll']:.3f} | "
            f"{r['rmse']:.3f} | | | | {r['seconds']:.0f} |"
        )
    for setting, steps in keys:
        for m in methods:
            for r in sorted(groups.get((setting, steps, m), []), key=lambda r: r["seed"]):
                lam = ", ".join(f"{v:.3f}" for v in r.get("lam", []))
                usd = ", ".join(f"{v:.3f}" for v in r.get("u_sd_median", []))
                lines.append(
                    f"| {setting} | {steps} | {LABELS[m]} | {r['seed']} | {r['std_inside']:.3f} | "
                    f"{r['std_far']:.3f} | {r['std_far'] / r['std_inside']:.1f} | "
                    f"{r['test_ll']:.3f} | {r['rmse']:.3f} | {r['elbo_per_point']:.3f} | {lam} | "
                    f"{usd} | {r['seconds']:.0f} |"
                )
    if nuts:
        lines += [
            "",
            f"NUTS: mean acceptance {nuts[0]['acceptance']:.2f}, max R-hat of f at 20 test inputs "
            f"{nuts[0]['max_rhat_test_f']:.3f}.",
        ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- digits
DIGITS_METHODS = ("ffg_u", "ensemble_u", "factorised", "ensemble_w")
NOTES_MARKER = "<!-- notes: kept when the table is rewritten -->"
DIGITS_LABELS = {
    "ffg_u": "FFG-U",
    "ensemble_u": "Ensemble-U",
    "factorised": "FFG-W",
    "ensemble_w": "Ensemble-W",
}


def with_notes(table: str, previous: str) -> str:
    """A rewritten table with the hand-written notes of its previous text kept: what follows
    :data:`NOTES_MARKER` there is appended after the marker."""
    if NOTES_MARKER not in previous:
        return table
    return table + "\n" + NOTES_MARKER + previous.split(NOTES_MARKER, 1)[1]


def ritter_schedule(steps: int):
    """Ritter et al. (2021, App. J)'s KL annealing scaled to ``steps``: no KL for the first third
    (100 of 300 epochs), then linear annealing over the next sixth (50 epochs), then the ELBO."""
    from deepgp_gi.training import LinearSchedule

    return LinearSchedule(max(1, steps // 6), delay_steps=steps // 3)


def digits_data(split: int):
    """Flattened digits ``[N, 64]`` standardised with the training pixels' mean and standard
    deviation (one number each); labels ``[N, 1]``."""
    data = dg.datasets.load_digits(split)
    Xtr, Xte = dg.datasets.standardise_images(
        data.X_train.reshape(len(data.X_train), -1), data.X_test.reshape(len(data.X_test), -1)
    )
    return Xtr, data.Y_train, Xte, data.Y_test


def digits_cell_key(row: dict) -> tuple:
    return (
        row["method"],
        row["seed"],
        row["split"],
        tuple(row["hidden"]),
        row["num_inducing"],
        row["steps"],
        row["kl_schedule"],
    )


def digits_cell(args, method: str, seed: int, data) -> dict:
    Xtr, Ytr, Xte, Yte = data
    options = {}
    if method in ("ffg_u", "ensemble_u"):
        options["num_inducing"] = args.num_inducing
    if method in ("ensemble_u", "ensemble_w"):
        options["num_members"] = args.num_members
    tf.random.set_seed(seed)
    model = dg.build_bnn(
        Xtr,
        Ytr,
        hidden=args.hidden,
        posterior=method,
        likelihood=gpflow.likelihoods.Softmax(10),
        activation=args.activation,
        seed=seed,
        **options,
    )
    schedule = {"ritter": ritter_schedule(args.steps), "none": None}.get(
        args.kl_schedule, args.kl_schedule
    )
    t0 = time.perf_counter()
    dg.fit(
        model,
        (Xtr, Ytr),
        steps=args.steps,
        batch_size=args.batch_size,
        learning_rate=args.lr,
        num_samples=args.train_samples,
        seed=seed,
        progress=False,
        log_every=max(1, args.steps // 10),
        kl_schedule=schedule,
    )
    seconds = time.perf_counter() - t0
    S = args.test_samples
    probs = model.predict_y(Xte, S, seed=seed)[0].numpy()
    labels = Yte[:, 0].astype(int)
    elbo = float(model.elbo((Xtr, Ytr), args.elbo_samples, seed=seed + 1000).numpy()) / len(Xtr)
    return {
        "method": method,
        "seed": seed,
        "split": args.split,
        "hidden": list(args.hidden),
        "activation": args.activation,
        "num_inducing": args.num_inducing if method in ("ffg_u", "ensemble_u") else None,
        "num_members": args.num_members if method in ("ensemble_u", "ensemble_w") else None,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "train_samples": args.train_samples,
        "kl_schedule": args.kl_schedule,
        "test_samples": S,
        "accuracy": dg.metrics.top1_accuracy(probs, labels),
        "test_ll": dg.metrics.test_log_likelihood(model, Xte, Yte, num_samples=S, seed=seed),
        "ece": dg.metrics.expected_calibration_error(probs, labels, num_bins=15),
        "entropy": float(np.mean(dg.metrics.categorical_entropy(probs))),
        "elbo_per_image": elbo,
        "params": dg.parameter_count(model),
        "params_per_layer": dg.parameter_count(model, per_layer=True),
        "seconds": seconds,
        "commit": code_commit(),
        "command": "python benchmarks/inducing_weights.py "
        + " ".join(shlex.quote(a) for a in args.argv),
    }


def digits_report(rows, out: Path, command: str) -> str:
    """The markdown table (mean +- standard error over seeds) of the digits cells."""
    groups = {}
    for r in rows:
        key = (
            tuple(r["hidden"]),
            r["steps"],
            r["kl_schedule"],
            r["num_inducing"] or 0,
            r["method"],
        )
        groups.setdefault(key, []).append(r)
    order = {m: i for i, m in enumerate(DIGITS_METHODS)}
    any_row = rows[0]
    lines = [
        "# Inducing weights: classification on the bundled 8x8 digits",
        "",
        "Commands (`nice -n 19` on a shared 2-core machine; resumable: a cell already in "
        f"`{out.with_suffix('.jsonl').name}` is skipped; each line records its own command, "
        "commit and settings):",
        "",
        *_commands(rows, command),
        "",
        f"Data: `deepgp_gi.datasets.load_digits(split={any_row['split']})`, 1,500 training / 297 "
        "test images, flattened to 64 inputs and standardised with the training pixels' mean and "
        f"standard deviation (one number each). Dense {any_row['activation']} BNN, Neal prior "
        "N(0, 1/d_in), `gpflow.likelihoods.Softmax(10)`. Adam, minibatches of "
        f"{any_row['batch_size']}, lr {any_row['lr']}, {any_row['train_samples']} Monte Carlo "
        "sample(s) per step; KL schedule `ritter` = no KL for the first third of the steps, "
        "linear annealing over the next sixth (Ritter et al. App. J's 100 + 50 of 300 epochs, "
        f"scaled). Ensembles: K = {any_row.get('num_members') or 5} members, member i trained "
        "when drawn (1/K of the steps each).",
        "",
        f"Metrics on the test images from {any_row['test_samples']} predictive samples: accuracy "
        "and ECE (15 equal-width bins, `expected_calibration_error` on `predict_y(X, S)[0]`) in "
        "%, test log-likelihood (`metrics.test_log_likelihood`) and predictive entropy in nats; "
        "ELBO per training image (untempered). For Ensemble-U the 'ELBO' has no U-term (the KL of "
        "point masses is undefined; docs/algorithms.md, 'Paper versus reference code', item 11) "
        "and for Ensemble-W it is the expected log-likelihood alone, so those two are training "
        "objectives, not bounds. Mean ± standard error over seeds (n); params = "
        "`dg.parameter_count(model)`; time = training seconds on one CPU thread of a shared "
        "machine.",
        "",
        "| hidden | steps | M | method | n | accuracy | test LL | ECE | entropy | ELBO / image | "
        "params | time (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(groups, key=lambda k: (k[0], k[1], k[2], order.get(k[4], 9), k[3])):
        g = groups[key]

        def cell(name, scale=1.0, digits=3):
            m, s, _ = mean_se(r[name] * scale for r in g)
            return f"{m:.{digits}f}" + ("" if math.isnan(s) else f" ± {s:.{digits}f}")

        M = g[0]["num_inducing"]
        lines.append(
            f"| {'-'.join(map(str, key[0]))} | {key[1]} | {M if M else ''} | "
            f"{DIGITS_LABELS[key[4]]} | {len(g)} | {cell('accuracy', 100, 1)} | {cell('test_ll')} "
            f"| {cell('ece', 100, 2)} | {cell('entropy')} | {cell('elbo_per_image')} | "
            f"{g[0]['params']:,} | {cell('seconds', 1, 0)} |"
        )
    return "\n".join(lines) + "\n"


def digits_main(argv):
    p = argparse.ArgumentParser(
        prog="inducing_weights.py digits",
        description="FFG-U / Ensemble-U / FFG-W / Ensemble-W on the bundled 8x8 digits.",
    )
    p.add_argument("--methods", default=",".join(DIGITS_METHODS))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--split", type=int, default=0)
    p.add_argument("--hidden", default="100", help="comma-separated hidden widths")
    p.add_argument("--activation", default="relu")
    p.add_argument("--num-inducing", type=int, default=32)
    p.add_argument("--num-members", type=int, default=5)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--train-samples", type=int, default=1)
    p.add_argument("--test-samples", type=int, default=100)
    p.add_argument("--elbo-samples", type=int, default=32)
    p.add_argument("--kl-schedule", default="ritter", choices=("ritter", "paper", "linear", "none"))
    p.add_argument("--out", default=str(RESULTS / "inducing_weights_digits.jsonl"))
    args = p.parse_args(argv)
    args.argv = ["digits"] + list(argv)
    args.hidden = tuple(int(h) for h in args.hidden.split(","))
    set_threads(1)
    out = Path(args.out)
    rows = read_lines(args.out)
    done = {digits_cell_key(r) for r in rows}
    data = digits_data(args.split)
    for seed in map(int, args.seeds.split(",")):
        for method in args.methods.split(","):
            probe = dict(
                method=method,
                seed=seed,
                split=args.split,
                hidden=args.hidden,
                steps=args.steps,
                num_inducing=args.num_inducing if method in ("ffg_u", "ensemble_u") else None,
                kl_schedule=args.kl_schedule,
            )
            if digits_cell_key(probe) in done:
                print(f"skip {method} seed {seed} (in {out.name})", flush=True)
                continue
            row = digits_cell(args, method, seed, data)
            append_line(args.out, row)
            rows.append(row)
            print(
                f"{method} seed {seed}: accuracy {row['accuracy']:.3f}, test LL "
                f"{row['test_ll']:.3f}, ECE {row['ece']:.4f}, ELBO/N {row['elbo_per_image']:.3f}, "
                f"{row['params']:,} params, {row['seconds']:.0f}s",
                flush=True,
            )
    if rows:
        md = out.with_suffix(".md")
        command = "nice -n 19 python benchmarks/inducing_weights.py " + " ".join(
            shlex.quote(a) for a in args.argv
        )
        text = with_notes(
            digits_report(rows, md, command.strip()), md.read_text() if md.exists() else ""
        )
        md.write_text(text)
        print(text)


if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv and argv[0] == "digits":
        digits_main(argv[1:])
    elif argv and argv[0] == "toy-settings":
        toy_settings_main(argv[1:])
    else:
        main()
