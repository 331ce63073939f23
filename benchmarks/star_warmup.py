"""The first thousands of Adam steps of STAR against mean-field (docs/structured.md, "The
first steps").

    python benchmarks/star_warmup.py [--setting toy|concrete] [--steps 6000] [--every 250]
        [--variants mean_field,plain,preconditioned] [--seeds 0] [--threads 1]
        [--out benchmarks/results/star_warmup.jsonl] [--md benchmarks/results/star_warmup.md]
        [--plot benchmarks/results/star_warmup.png]

Settings (``dg.build_deep_gp(..., depth=3, seed=seed)``, Adam 0.01 as ``dg.fit``, the same
minibatches and Monte Carlo noise for every variant of a seed):

* ``toy``: 100 points, ``X ~ N(0, I_2)``, ``y = sin(x_1) + x_2^2 / 2 + 0.05 eps`` standardised (the
  data of ``tests/test_builders.py``, from ``numpy.random.default_rng(20261122)``), M = 16, full
  batch, two training samples;
* ``concrete``: UCI concrete, extrapolation split 0, M = 100, batch 512, one training sample (as
  ``benchmarks/star_offdiagonal.py``).

Variants (:data:`VARIANTS`): ``mean_field``; ``plain`` (STAR, the off-diagonal blocks stored as the
blocks of ``R``, ``precondition_offdiagonal=False``); ``preconditioned`` (the library's default
storage); ``preconditioned_step1`` (the preconditioned storage with Adam's full steps on its blocks,
``offdiagonal_step=1``: the default before the fix of the first steps, which takes ``1 / sqrt(M)``).

Every ``--every`` steps one JSON line per (setting, variant, seed, step) is appended to ``--out``
(lines already there are skipped, so an interrupted run resumes; a line holds the command that wrote
it) with, on the full training set and a fixed evaluation noise shared by every variant:

* ``elbo``, ``ell``, ``kl``: the ELBO, expected log-likelihood and KL, per datapoint (64 joint
  samples for the toy, 16 for concrete);
* ``offdiag_gain``: the ELBO per datapoint minus that of the same posterior with its stripe and
  arrow blocks set to zero (a mean-field posterior), same noise: what the off-diagonal blocks are
  worth;
* ``kl_offdiag``: ``|L_K^{-1} R_{i,j}|_F^2 / 2`` summed over the stripe and arrow blocks,
  per datapoint;
* ``arrow_R_rms``, ``stripes_R_rms``: the root-mean-square entry of those blocks of ``R``;
  ``arrow_white_rms``: of ``L_K^{-1} R_{i,j}``; ``diag_hidden_rms``, ``diag_out_rms``: of the lower
  triangles of the diagonal blocks;
* ``arrow_step_R``, ``arrow_step_white``: the root-mean-square change of an arrow entry of ``R``
  (and of ``L_K^{-1} R``) in the last Adam step of the interval;
* ``whiten``, ``likelihood_variance``, ``wall_s``.

``--md`` gets a table (ELBO per datapoint at every 1,000 steps, averaged over the seeds) with the
command; ``--plot`` the ELBO-per-datapoint curves.
"""

from __future__ import annotations

if not __package__:  # run by path: load benchmarks/ as the package (benchmarks/_by_path.py)
    import _by_path  # noqa: F401  (imported for its side effect)

import argparse
import os
import shlex
import sys
import time

from benchmarks.common import append_line, read_lines, set_threads

HERE = os.path.dirname(os.path.abspath(__file__))

DEFAULT_OUT = os.path.join(HERE, "results", "star_warmup.jsonl")
DEFAULT_MD = os.path.join(HERE, "results", "star_warmup.md")
DEFAULT_PLOT = os.path.join(HERE, "results", "star_warmup.png")

#: variant -> (posterior, build options, label)
VARIANTS = {
    "mean_field": ("mean_field", {}, "mean-field"),
    "plain": ("stripes_arrow", {"precondition_offdiagonal": False}, "STAR, plain blocks"),
    "preconditioned_step1": (
        "stripes_arrow",
        {"precondition_offdiagonal": True, "offdiagonal_step": 1.0},
        "STAR, preconditioned, offdiagonal_step=1 (before)",
    ),
    "preconditioned": ("stripes_arrow", {}, "STAR, preconditioned (default)"),
}

#: setting -> (inducing points, batch size or None, training samples, evaluation samples)
SETTINGS = {"toy": (16, None, 2, 64), "concrete": (100, 512, 1, 16)}


def toy_data():
    """The toy set: 100 points, 2-D inputs, noise 0.05, standardised targets."""
    import numpy as np

    rng = np.random.default_rng(20261122)
    X = rng.normal(size=(100, 2))
    Y = np.sin(X[:, :1]) + 0.5 * X[:, 1:2] ** 2 + 0.05 * rng.normal(size=(100, 1))
    return X, (Y - Y.mean()) / Y.std()


def load(setting):
    if setting == "toy":
        return toy_data()
    from deepgp_gi import datasets

    data = datasets.load_uci("concrete", 0, protocol="extrapolation")
    return data.X_train, data.Y_train


def _key(rec):
    return (rec["setting"], rec["variant"], rec["seed"], rec["step"])


class _Diagnostics:
    """The quantities of one JSON line for a model (see the module docstring)."""

    def __init__(self, model, X, Y, num_samples):
        import tensorflow as tf

        self.model, self.post = model, model.posterior
        self.N = X.shape[0]
        data = (tf.constant(X, model.dtype), tf.constant(Y, model.dtype))
        seed = tf.constant([20261122, 7], tf.int64)  # the evaluation noise, shared by every variant
        self.terms = tf.function(lambda: model.elbo_terms(data, num_samples, seed), autograph=False)
        self.star = hasattr(self.post, "arrow")

    def _blocks(self):
        """(whitened arrow, arrow of R, stripes of R, diag) as numpy arrays."""
        import numpy as np
        import scipy.linalg

        post = self.post
        M, T = post.num_inducing, post.num_units
        R = post.dense_sqrt().numpy()
        if post.whiten:
            Lk = np.eye(M)
        else:
            from deepgp_gi.posteriors.conditionals import inducing_cholesky

            Lk = inducing_cholesky(post.layers[-1], post.layers[-1].Z).numpy()
        arrow = R[-M:, :-M]
        stripes = [R[i * M : (i + 1) * M, : (i // post.tau) * post.tau * M] for i in range(T - 1)]
        stripes = np.concatenate([s.ravel() for s in stripes]) if post.use_stripes else np.zeros(1)
        white = scipy.linalg.solve_triangular(Lk, arrow, lower=True)
        return white, arrow, stripes, post.diag.numpy()

    def _offdiag_kl(self):
        import numpy as np
        import tensorflow as tf

        kl_all = float(self.post.kl_divergence())
        saved = [(p, p.numpy()) for p in (self.post.stripes, self.post.arrow) if p is not None]
        for p, v in saved:
            p.assign(np.zeros_like(v))
        kl_zero = float(self.post.kl_divergence())
        ell, kl = self.terms()
        elbo_zero = float(tf.reduce_mean(ell - kl))
        for p, v in saved:
            p.assign(v)
        return (kl_all - kl_zero) / self.N, elbo_zero / self.N

    def __call__(self, before=None):
        import numpy as np
        import tensorflow as tf

        ell, kl = self.terms()
        rec = dict(
            elbo=float(tf.reduce_mean(ell - kl)) / self.N,
            ell=float(tf.reduce_mean(ell)) / self.N,
            kl=float(kl[0]) / self.N,
            likelihood_variance=float(self.model.likelihood.variance.numpy()),
            whiten=bool(getattr(self.post, "whiten", False)),
        )
        if not self.star:
            return rec

        def rms(a):
            return float(np.sqrt(np.mean(np.square(a))))

        white, arrow, stripes, diag = self._blocks()
        kl_off, elbo_zero = self._offdiag_kl()
        tril = np.tril(np.ones(diag.shape[1:], bool))
        rec.update(
            offdiag_gain=rec["elbo"] - elbo_zero,
            kl_offdiag=kl_off,
            arrow_R_rms=rms(arrow),
            stripes_R_rms=rms(stripes),
            arrow_white_rms=rms(white),
            diag_hidden_rms=rms(diag[:-1][:, tril]),
            diag_out_rms=rms(diag[-1][tril]),
        )
        if before is not None:
            rec.update(arrow_step_R=rms(arrow - before[1]), arrow_step_white=rms(white - before[0]))
        return rec


def run(args, setting, variant, seed, done, command):
    import tensorflow as tf

    from deepgp_gi.builders import build_deep_gp
    from deepgp_gi.training.batches import array_batches
    from deepgp_gi.training.optimizers import adam
    from deepgp_gi.training.step import TrainStep

    checkpoints = list(range(args.every, args.steps + 1, args.every))
    if all((setting, variant, seed, s) in done for s in checkpoints):
        return
    posterior, options, _ = VARIANTS[variant]
    M, batch_size, train_samples, eval_samples = SETTINGS[setting]
    X, Y = load(setting)
    N = X.shape[0]
    model = build_deep_gp(X, Y, depth=3, posterior=posterior, num_inducing=M, seed=seed, **options)
    diagnostics = _Diagnostics(model, X, Y, eval_samples)
    # fit's pieces, so that the model can be inspected between steps: the same optimiser, step and
    # minibatch stream as dg.fit(model, (X, Y), steps=..., batch_size=..., learning_rate=0.01,
    # num_samples=..., seed=seed)
    variables = [v for v in model.trainable_variables if getattr(v, "_trainable", True)]
    optimizer = adam(0.01, variables)
    counter = tf.Variable(0, dtype=tf.int64, trainable=False)
    step_fn = TrainStep(model, optimizer, variables, counter, num_samples=train_samples, seed=seed)
    Xt, Yt = tf.constant(X, model.dtype), tf.constant(Y, model.dtype)
    t0 = time.perf_counter()
    for step, X_b, Y_b in array_batches(Xt, Yt, 0, args.steps, batch_size or N, seed):
        t = int(step.numpy()) + 1
        before = diagnostics._blocks() if diagnostics.star and t % args.every == 0 else None
        step_fn(step, X_b, Y_b)
        if t % args.every:
            continue
        step_fn.raise_if_failed()
        rec = dict(
            setting=setting,
            variant=variant,
            seed=seed,
            step=t,
            **diagnostics(before),
            wall_s=round(time.perf_counter() - t0, 1),
            command=command,
        )
        if _key(rec) not in done:
            append_line(args.out, rec)
        print(
            f"{setting} {variant} seed {seed} step {t}: ELBO/N {rec['elbo']:.3f} KL/N "
            f"{rec['kl']:.3f}"
            + (f" off-diagonal gain {rec['offdiag_gain']:+.3f}" if "offdiag_gain" in rec else ""),
            flush=True,
        )


def _means(records):
    """{(setting, variant, step): (mean ELBO/N, number of seeds)}."""
    import numpy as np

    acc = {}
    for r in records:
        acc.setdefault((r["setting"], r["variant"], r["step"]), []).append(r["elbo"])
    return {k: (float(np.mean(v)), len(v)) for k, v in acc.items()}


#: the steps shown in the markdown table (those recorded)
TABLE_STEPS = (100, 250, 300, 500, 1000, 1500, 2000, 3000, 4000, 5000, 6000)


def write_md(records, path):
    means = _means(records)
    commands = sorted({r["command"] for r in records if "command" in r})
    lines = [
        "# STAR's first steps against mean-field (depth 3, Adam 0.01)",
        "",
        "Regenerate (the commands that wrote the lines; `--report-only` rewrites this file and "
        "the plot):",
        "",
    ]
    lines += [f"    {c}" for c in commands] + [""]
    lines += [
        "ELBO per datapoint on the full training set (fixed evaluation noise), averaged over the "
        "seeds (their number in brackets); every variant of a seed starts from the same model and "
        "sees the same minibatches and training noise. `benchmarks/star_warmup.py` describes the "
        "settings.",
        "",
    ]
    for setting in SETTINGS:
        steps = sorted({k[2] for k in means if k[0] == setting})
        if not steps:
            continue
        shown = [s for s in steps if s in TABLE_STEPS]
        lines += [
            f"## {setting}",
            "",
            "| variant | " + " | ".join(f"{s:,}" for s in shown) + " |",
            "|---|" + "---|" * len(shown),
        ]
        for v, (_, _, label) in VARIANTS.items():
            cells = [means.get((setting, v, s)) for s in shown]
            if all(c is None for c in cells):
                continue
            lines.append(
                f"| {label} | "
                + " | ".join("—" if c is None else f"{c[0]:.3f} ({c[1]})" for c in cells)
                + " |"
            )
        lines += [
            "",
            "Diagnostics (means over the seeds; per datapoint; rms = root-mean-square entry; the "
            "arrow's step is its change in the interval's last Adam step):",
            "",
            "| variant | step | ELL/N | KL/N | off-diagonal gain | off-diagonal KL/N | "
            "arrow rms, R | arrow rms, L_K^-1 R | arrow step, R | arrow step, L_K^-1 R |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        keys = (
            "ell",
            "kl",
            "offdiag_gain",
            "kl_offdiag",
            "arrow_R_rms",
            "arrow_white_rms",
            "arrow_step_R",
            "arrow_step_white",
        )
        for v, (_, _, label) in VARIANTS.items():
            for step in sorted({steps[0], 500, 2000, steps[-1]} & set(steps)):
                rows = [
                    r
                    for r in records
                    if (r["setting"], r["variant"], r["step"]) == (setting, v, step)
                ]
                if not rows:
                    continue
                cells = []
                for k in keys:
                    vals = [r[k] for r in rows if r.get(k) is not None]
                    cells.append("—" if not vals else f"{sum(vals) / len(vals):.3g}")
                lines.append(f"| {label} | {step:,} | " + " | ".join(cells) + " |")
        lines.append("")
    with open(path, "w") as fh:
        fh.write("\n".join(lines))


def plot(records, path):
    """Per setting: ELBO per datapoint over the run (top 3 nats), and its difference to mean-field's
    with the same seed (symmetric-log scale, so the first steps' nats and the later tenths show)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from benchmarks import plot_style

    # the family's colour; STAR's storages differ by line style (the default solid)
    linestyles = {"plain": ":", "preconditioned_step1": "--", "preconditioned": "-"}

    means = _means(records)
    mf = {
        (r["setting"], r["seed"], r["step"]): r["elbo"]
        for r in records
        if r["variant"] == "mean_field"
    }
    settings = [s for s in SETTINGS if any(k[0] == s for k in means)]
    fig, axes = plt.subplots(len(settings), 2, figsize=(12, 3.6 * len(settings)), squeeze=False)
    for (left, right), setting in zip(axes, settings):
        shown, counts = [], set()
        for v, (family, _, label) in VARIANTS.items():
            style = dict(color=plot_style.family_colour(family), ls=linestyles.get(v, "-"))
            pts = sorted((k[2], m[0]) for k, m in means.items() if k[0] == setting and k[1] == v)
            if not pts:
                continue
            seeds = max(means[(setting, v, s)][1] for s, _ in pts)
            left.plot(*zip(*pts), label=f"{label} ({seeds} seed{'s' * (seeds > 1)})", **style)
            counts.add(seeds)
            shown += [e for _, e in pts]
            if v == "mean_field":
                continue
            diff = {}
            for r in records:
                key = (r["setting"], r["seed"], r["step"])
                if r["setting"] == setting and r["variant"] == v and key in mf:
                    diff.setdefault(r["step"], []).append(r["elbo"] - mf[key])
            steps = sorted(diff)
            right.plot(
                steps, [np.mean(diff[s]) for s in steps], marker=".", ms=3, label=label, **style
            )
        hi = max(shown)
        left.set(
            title=f"{setting}, depth 3, Adam 0.01 (mean over "
            f"{'/'.join(map(str, sorted(counts)))} seed{'s' * (max(counts) > 1)})",
            xlabel="Adam step",
            ylabel="ELBO / N (nats, mean over seeds)",
            ylim=(max(min(shown), hi - 3.0), hi + 0.15),
        )
        right.axhline(0.0, color=plot_style.family_colour("mean_field"), lw=1, label="mean-field")
        right.set_yscale("symlog", linthresh=0.3)
        right.set(
            title=f"{setting}: ELBO / N minus mean-field's (same seed)",
            xlabel="Adam step",
            ylabel="difference (nats, mean over seeds; symlog)",
        )
    # one legend beside the panels (the same lines in every panel), off the data
    handles = [
        plt.Line2D(
            [],
            [],
            color=plot_style.family_colour(family),
            ls=linestyles.get(v, "-"),
            label=label,
        )
        for v, (family, _, label) in VARIANTS.items()
        if any(r["variant"] == v for r in records)
    ]
    fig.tight_layout()
    plot_style.legend_outside(fig, handles=handles, fontsize=9)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--setting", default="toy", choices=tuple(SETTINGS))
    p.add_argument("--steps", type=int, default=6000)
    p.add_argument("--every", type=int, default=250)
    p.add_argument("--variants", default="mean_field,plain,preconditioned_step1,preconditioned")
    p.add_argument("--seeds", default="0", help="comma-separated build and training seeds")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--md", default=DEFAULT_MD)
    p.add_argument("--plot", default=DEFAULT_PLOT)
    p.add_argument(
        "--report-only", action="store_true", help="only rewrite --md and --plot from --out"
    )
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            p.error(f"--variants: unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    if args.steps < args.every or args.every <= 0:
        p.error("--every must be positive and at most --steps")
    command = "python benchmarks/star_warmup.py " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)
    )
    command = command.strip()
    if not args.report_only:
        set_threads(args.threads)
        done = {_key(r) for r in read_lines(args.out)}
        for seed in seeds:
            for v in variants:
                run(args, args.setting, v, seed, done, command)
    records = read_lines(args.out)
    write_md(records, args.md)
    plot(records, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
