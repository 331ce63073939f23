"""A million rows to convergence: deep GPs trained from shards on data drawn from a known deep GP.

The data are ``--rows`` rows (default 10^6) of ``y = f2(f1(x)) + e``, ``x ~ N(0, I_3)``,
``e ~ N(0, 0.1^2)``, where ``f1: R^3 -> R`` and ``f2: R -> R`` are one draw each from GPs with
squared-exponential kernels (variance 1, lengthscales 1.5 and 0.75), represented exactly by
``--features`` random Fourier features (a GP with the random-feature kernel, whose expectation is
the squared-exponential kernel). Since the generating function is known, so is the true log density
of every test row, ``log N(y | f2(f1(x)), 0.1^2)``: the ceiling no model can beat on average.

The training rows are written once to TFRecord shards (``dg.datasets.write_shards``) and streamed
with ``dg.datasets.read_shards``; 10,000 test rows are drawn separately and held in memory. Three
configurations train a depth-2 deep GP with M inducing points, each in its own process (which
reports its peak RSS):

* ``mean_field_adam``: mean-field q(U), Adam on everything;
* ``mean_field_natgrad``: mean-field q(U) by natural gradients (gamma ``--natgrad-gamma``) on the
  layers ``--natgrad-layers`` names (``last``, the default: the output layer, Adam on the hidden
  layer's q(U) as on every other variable; ``all``: every layer's q(U), which diverges here at
  every gamma tried, see ``large.md``);
* ``global``: global inducing points (O&A 2021), Adam.

Training runs in ``--chunks`` chunks of ``--steps / --chunks`` steps; after each chunk the
process writes one JSON line to ``benchmarks/results/large.jsonl``: the training wall time, the
ELBO per row (estimated on 10,000 fixed training rows, 10 samples), the test log-likelihood and
RMSE (the 10,000 test rows, 32 samples), the minibatch ELBO trace and the peak RSS. ``fit``
checkpoints every chunk (and in between), so the command can be stopped and restarted at will: a
chunk already in the results file is skipped, a chunk that was interrupted resumes from its
checkpoint; a larger ``--steps`` with the same chunk length (``--steps 12000 --chunks 12``)
continues a finished run from its last checkpoint. ``report`` writes ``large.md`` (table) and
``large.png`` (ELBO and test LL against wall time, the true test log density as the ceiling line)
from the lines so far; it draws the test rows again for the ceiling and needs no shards.

Defaults: M = 50, batch 1,000, learning rate 0.01, 6,000 steps (6 epochs) in 6 chunks: 14 to 21
minutes of training per configuration on a 2-core CPU machine shared with other jobs (plus about a
minute per chunk for start-up and evaluation); writing the shards takes about 5 minutes once.

    # run (resumable), then report
    nice -n 5 python benchmarks/large.py
    # continue one longer
    python benchmarks/large.py --configs mean_field_adam --steps 12000 --chunks 12
    # the table and plot from the lines so far
    python benchmarks/large.py report
    # a quick check
    python benchmarks/large.py --fast --work-dir /tmp/x --results /tmp/x/large.jsonl
"""

from __future__ import annotations

if not __package__:  # run by path: load benchmarks/ as the package (benchmarks/_by_path.py)
    import _by_path  # noqa: F401  (imported for its side effect)

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time

import numpy as np

from benchmarks.common import append_line, read_lines

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
CONFIGS = ("mean_field_adam", "mean_field_natgrad", "global")
LABELS = {
    "mean_field_adam": "mean-field, Adam",
    "mean_field_natgrad": "mean-field, natural gradients",
    "global": "global inducing, Adam",
}

#: The generating deep GP: input dimension, noise sd, and each layer's (variance, lengthscale).
INPUT_DIM = 3
NOISE_SD = 0.1
LAYERS = ((1.0, 1.5), (1.0, 0.75))
NUM_TEST = 10_000
NUM_PROBE = 10_000


# -- the generating deep GP -----------------------------------------------------------------------


class RandomFeatureGP:
    """One draw ``f`` from a GP with kernel ``variance * exp(-|x - x'|^2 / (2 lengthscale^2))``,
    approximated by ``K`` random Fourier features: ``f(x) = sqrt(2 variance / K) sum_k a_k
    cos(w_k . x / lengthscale + b_k)`` with ``a_k ~ N(0, 1)``, ``w_k ~ N(0, I)``, ``b_k ~
    U(0, 2 pi)``. The draw is exactly a sample of the GP whose kernel is the features' inner
    product, whose expectation over ``(w, b)`` is the squared-exponential kernel."""

    def __init__(
        self,
        input_dim: int,
        variance: float,
        lengthscale: float,
        num_features: int,
        rng: np.random.Generator,
    ):
        self.variance, self.lengthscale = float(variance), float(lengthscale)
        self.W = rng.normal(size=(input_dim, num_features))
        self.b = rng.uniform(0.0, 2.0 * np.pi, size=num_features)
        self.a = rng.normal(size=num_features)

    def features(self, X: np.ndarray) -> np.ndarray:
        K = self.W.shape[1]
        return np.sqrt(2.0 * self.variance / K) * np.cos(X @ self.W / self.lengthscale + self.b)

    def __call__(self, X: np.ndarray, chunk: int = 50_000) -> np.ndarray:
        """``[N, 1]`` function values at ``X [N, D]`` (in chunks of rows, so memory stays
        bounded)."""
        return np.concatenate(
            [self.features(X[i : i + chunk]) @ self.a[:, None] for i in range(0, len(X), chunk)]
            or [np.zeros((0, 1))]
        )


class GeneratingDeepGP:
    """``y = f2(f1(x)) + N(0, noise_sd^2)`` with ``f1``, ``f2`` :class:`RandomFeatureGP` draws
    (``layers``: each layer's (variance, lengthscale); each hidden layer is one-dimensional)."""

    def __init__(
        self,
        seed: int = 0,
        num_features: int = 500,
        input_dim: int = INPUT_DIM,
        layers=LAYERS,
        noise_sd: float = NOISE_SD,
    ):
        rng = np.random.default_rng([seed, 1])
        dims = [input_dim] + [1] * len(layers)
        self.layers = [
            RandomFeatureGP(dims[i], v, ell, num_features, rng) for i, (v, ell) in enumerate(layers)
        ]
        self.input_dim, self.noise_sd = input_dim, float(noise_sd)

    def f(self, X: np.ndarray) -> np.ndarray:
        H = X
        for layer in self.layers:
            H = layer(H)
        return H

    def sample(self, num_rows: int, seed: int) -> tuple:
        """``(X [N, D], Y [N, 1])``: inputs ``N(0, I)``, targets with noise, from stream
        ``seed``."""
        rng = np.random.default_rng([seed, 2])
        X = rng.normal(size=(num_rows, self.input_dim))
        return X, self.f(X) + self.noise_sd * rng.normal(size=(num_rows, 1))

    def log_density(self, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        """``[N]``: the true ``log p(y | x) = log N(y | f2(f1(x)), noise_sd^2)`` of each row."""
        r = (Y - self.f(X))[:, 0] / self.noise_sd
        return -0.5 * np.log(2.0 * np.pi) - np.log(self.noise_sd) - 0.5 * r**2


def ceiling_info(num_features: int, seed: int = 0) -> dict:
    """The true log density of the test rows (the ceiling no model beats on average): its mean
    ``true_test_ll`` and standard error ``true_test_ll_se`` over the rows, with ``num_features``.
    The test rows do not depend on the number of training rows, so no shards are needed."""
    gen = GeneratingDeepGP(seed, num_features)
    lpd = gen.log_density(*gen.sample(NUM_TEST, seed=seed + 1000))
    return dict(
        num_features=num_features,
        true_test_ll=float(np.mean(lpd)),
        true_test_ll_se=float(np.std(lpd) / np.sqrt(len(lpd))),
    )


def make_data(
    work_dir: str, rows: int, num_features: int, seed: int = 0, rows_per_shard: int = 50_000
) -> dict:
    """Write (once) the training shards and the test rows; return their paths and the ceiling."""
    import deepgp_gi as dg

    folder = os.path.join(work_dir, f"deep-gp-{rows}-f{num_features}-s{seed}")
    test_file = os.path.join(folder, "test.npz")
    if not os.path.exists(os.path.join(folder, "shards", "shards.json")):
        gen = GeneratingDeepGP(seed, num_features)
        t0 = time.perf_counter()
        X, Y = gen.sample(rows, seed=seed)
        dg.datasets.write_shards(
            X, Y, os.path.join(folder, "shards"), num_shards=max(1, min(64, rows // rows_per_shard))
        )
        del X, Y
        Xt, Yt = gen.sample(NUM_TEST, seed=seed + 1000)
        lpd = gen.log_density(Xt, Yt)
        np.savez(test_file, X=Xt, Y=Yt, true_log_density=lpd)
        with open(os.path.join(folder, "data.json"), "w") as fh:
            json.dump(
                dict(
                    rows=rows,
                    num_features=num_features,
                    seed=seed,
                    write_s=time.perf_counter() - t0,
                    true_test_ll=float(np.mean(lpd)),
                    true_test_ll_se=float(np.std(lpd) / np.sqrt(len(lpd))),
                    noise_sd=NOISE_SD,
                    layers=LAYERS,
                    input_dim=INPUT_DIM,
                ),
                fh,
                indent=1,
            )
    with open(os.path.join(folder, "data.json")) as fh:
        info = json.load(fh)
    return dict(info, shards=os.path.join(folder, "shards"), test=test_file)


# -- one configuration, in its own process --------------------------------------------------------


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _placeholders_then(stream, first, count: int):
    """``count`` copies of the batch ``first`` followed by ``stream``: ``fit`` skips the batches of
    the steps a checkpoint already holds, and a placeholder costs nothing to skip where a streamed
    batch costs a read of the shards."""
    import tensorflow as tf

    if count == 0:
        return stream
    return tf.data.Dataset.from_tensors(first).repeat(count).concatenate(stream)


def worker(cfg: dict) -> None:
    import tensorflow as tf

    import deepgp_gi as dg

    shards = cfg["shards"]
    N = dg.datasets.shard_info(shards)["num_rows"]
    test = np.load(cfg["test"])
    X_test, Y_test = test["X"], test["Y"]
    probe = next(iter(dg.datasets.read_shards(shards, min(N, NUM_PROBE), shuffle=False)))
    X_probe, Y_probe = probe[0].numpy(), probe[1].numpy()
    # the builder initialises from the first rows (k-means inducing inputs, PCA mean maps); the
    # rest streams
    posterior = "global" if cfg["config"] == "global" else "mean_field"
    model = dg.build_deep_gp(
        X_probe, Y_probe, depth=2, posterior=posterior, num_inducing=cfg["M"], seed=0
    )
    model.num_data = N
    natgrad = cfg["natgrad_gamma"] if cfg["config"] == "mean_field_natgrad" else None
    natgrad_layers = cfg.get("natgrad_layers", "all") if natgrad is not None else "all"
    ckpt = os.path.join(cfg["work_dir"], "checkpoints", cfg["key"])
    done = {r["step"] for r in read_lines(cfg["results"]) if r["key"] == cfg["key"] and "step" in r}
    steps = cfg["steps"]
    ends = [int(round(steps * (k + 1) / cfg["chunks"])) for k in range(cfg["chunks"])]
    start = 0
    for end in ends:
        if end in done:
            start = end
            continue
        # a fresh seeded shuffle per chunk, streamed forever; the steps already done are
        # placeholders
        stream = dg.datasets.read_shards(
            shards, cfg["batch"], shuffle=True, seed=1 + start, repeat=True
        )
        data = _placeholders_then(stream, (X_probe[: cfg["batch"]], Y_probe[: cfg["batch"]]), start)
        t0 = time.perf_counter()
        try:
            history = dg.fit(
                model,
                data,
                steps=end,
                seed=0,
                learning_rate=cfg["lr"],
                natgrad_gamma=natgrad,
                natgrad_layers=natgrad_layers,
                checkpoint_dir=ckpt,
                checkpoint_every=max(1, (end - start) // 4),
                log_every=max(1, steps // cfg["chunks"] // 60),
                progress=cfg["progress"],
            )
        except (
            ValueError,
            FloatingPointError,
            tf.errors.InvalidArgumentError,
            dg.linalg.CholeskyError,
        ) as err:
            # recorded for the report; the same settings replay the same steps, so a rerun fails
            # the same way
            append_line(
                cfg["results"],
                dict(
                    key=cfg["key"],
                    config=cfg["config"],
                    failed_in=[start, end],
                    natgrad_gamma=natgrad,
                    natgrad_layers=natgrad_layers,
                    error=_last_line(err),
                    command=cfg["command"],
                ),
            )
            raise
        fit_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        ell, kl = model.elbo_terms((X_probe, Y_probe), 10, seed=end)
        elbo = (
            float(tf.reduce_mean(ell)) - float(tf.reduce_mean(kl))
        ) / N  # ell is rescaled to N rows
        lpd = dg.metrics.pointwise_log_density(model, X_test, Y_test, num_samples=32, seed=end)
        mean = dg.metrics.predict_in_chunks(
            lambda s: model.predict_y(X_test[s], 32)[0].numpy(), X_test, 1000
        )
        row = dict(
            key=cfg["key"],
            config=cfg["config"],
            rows=N,
            M=cfg["M"],
            batch=cfg["batch"],
            lr=cfg["lr"],
            natgrad_gamma=natgrad,
            natgrad_layers=natgrad_layers,
            steps_total=steps,
            step=end,
            epochs=end * cfg["batch"] / N,
            train_wall_s=history.wall_time[-1],
            chunk_fit_s=fit_s,
            eval_s=time.perf_counter() - t1,
            elbo_per_row=elbo,
            test_ll=float(np.mean(lpd)),
            test_ll_se=float(np.std(lpd) / np.sqrt(len(lpd))),
            test_rmse=float(np.sqrt(np.mean((Y_test - mean) ** 2))),
            noise_sd_fit=float(np.sqrt(model.likelihood.variance.numpy())),
            trace_step=[s for s in history.step if s > start],
            trace_wall_s=[w for s, w in zip(history.step, history.wall_time) if s > start],
            trace_elbo_per_row=[e / N for s, e in zip(history.step, history.elbo) if s > start],
            peak_rss_mb=_peak_rss_mb(),
            command=cfg["command"],
        )
        append_line(cfg["results"], row)
        print(json.dumps({k: v for k, v in row.items() if not k.startswith("trace")}), flush=True)
        start = end


def _last_line(err: Exception) -> str:
    """The message of ``err`` without TensorFlow's trace of where the op was defined: its last line
    that is not a node name."""
    lines = [
        line.strip()
        for line in str(err).splitlines()
        if line.strip() and not line.strip().startswith("[[")
    ]
    return f"{type(err).__name__}: {lines[-1] if lines else ''}"[:400]


def run_config(cfg: dict) -> None:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_USE_LEGACY_KERAS="1")
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "worker", json.dumps(cfg)], env=env
    )
    if out.returncode != 0:
        raise RuntimeError(
            f"configuration {cfg['key']} failed (exit {out.returncode}); rerun the command to "
            "resume"
        )


# -- report ----------------------------------------------------------------------------------------


def report(results: str, out_md: str, out_png: str | None, data_info: dict | None = None) -> str:
    """The report of the lines in ``results`` (:func:`render_report`) written to ``out_md``, with
    the plot ``out_png`` (none if None); the text is returned."""
    lines = read_lines(results)
    if not any("step" in r for r in lines):
        raise SystemExit(f"{results} holds no results yet")
    text = render_report(lines, data_info, os.path.basename(out_png) if out_png else None)
    if out_png:
        _plot(_by_key(lines), data_info["true_test_ll"] if data_info else None, out_png)
    with open(out_md, "w") as fh:
        fh.write(text)
    return text


def _by_key(lines: list) -> dict:
    """The chunk lines (not the failures) by configuration key, each in step order."""
    by_key: dict = {}
    for r in lines:
        if "step" in r:
            by_key.setdefault(r["key"], []).append(r)
    for v in by_key.values():
        v.sort(key=lambda r: r["step"])
    return by_key


def render_report(records: list, data_info: dict | None = None, png_name: str | None = None) -> str:
    """The markdown report of the result lines ``records``; ``data_info`` (:func:`ceiling_info`'s
    keys) gives the ceiling; ``png_name``, the plot's file name, is linked at the end when given."""
    failures = [r for r in records if "failed_in" in r]
    rows = [r for r in records if "step" in r]
    by_key = _by_key(rows)
    ceiling = data_info["true_test_ll"] if data_info else None
    first = rows[0]
    commands = sorted({r["command"] for r in rows})
    lines = [
        "# A million rows to convergence: deep GPs from shards, data from a known deep GP",
        "",
        "Command (resumable; each configuration runs in its own process, peak RSS is that "
        "process's):",
        "",
        *[f"    {c}" for c in commands],
        "",
        f"Data: {first['rows']:,} training rows of `y = f2(f1(x)) + e`, `x ~ N(0, I_3)`, `e ~ "
        f"N(0, {NOISE_SD}^2)`, `f1`, `f2` one draw each from squared-exponential GPs (variance 1, "
        f"lengthscales {LAYERS[0][1]} and {LAYERS[1][1]}; "
        f"{data_info['num_features'] if data_info else '?'} random Fourier features), streamed "
        f"from TFRecord shards with `read_shards(shuffle=True)`; {NUM_TEST:,} test rows drawn "
        "separately. "
        + (
            "The true test log density (the generating model's own, the ceiling) is "
            f"**{ceiling:.4f}** (± {data_info['true_test_ll_se']:.4f} standard error over the "
            "test rows; its expectation is `-log(0.1 sqrt(2 pi)) - 1/2 = "
            f"{-math.log(NOISE_SD * math.sqrt(2 * math.pi)) - 0.5:.4f}`). "
            if ceiling
            else ""
        )
        + f"Model: depth-2 deep GP, M = {first['M']}, batch {first['batch']}, learning rate "
        f"{first['lr']}, one sample per step. ELBO per row: estimated on 10,000 fixed training "
        "rows with 10 samples; test LL and RMSE with 32 samples; the gap to the ceiling is on the "
        "same test rows. Wall time is training only (evaluations and start-up excluded; the first "
        "step of each chunk traces the step), on a 2-core CPU machine shared with other jobs: "
        "compare times within this file only.",
        "",
    ]
    order = sorted(by_key, key=lambda k: (CONFIGS.index(by_key[k][0]["config"]), k))
    lines += [
        "Summary (the last chunk of each configuration; the changes over that chunk say how close "
        "to convergence it is):",
        "",
        "| configuration | steps | train wall (s) | ELBO / row | change over last chunk | "
        "test LL | change over last chunk | gap to ceiling | peak RSS (MB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key in order:
        rs = by_key[key]
        last, prev = rs[-1], (rs[-2] if len(rs) > 1 else None)

        def change(name):
            return f"{last[name] - prev[name]:+.4f}" if prev else ""

        gap = f"{ceiling - last['test_ll']:.4f}" if ceiling is not None else ""
        lines.append(
            f"| {_label(last)} | {last['step']:,} | "
            f"{last['train_wall_s']:.0f} | {last['elbo_per_row']:.4f} | {change('elbo_per_row')} | "
            f"{last['test_ll']:.4f} | {change('test_ll')} | {gap} | {last['peak_rss_mb']:.0f} |"
        )
    lines += [
        "",
        "Every chunk:",
        "",
        "| configuration | steps | epochs | train wall (s) | ELBO / row | test LL | "
        "gap to ceiling | test RMSE | fitted noise sd | peak RSS (MB) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in order:
        for r in by_key[key]:
            gap = f"{ceiling - r['test_ll']:.4f}" if ceiling is not None else ""
            lines.append(
                f"| {_label(r)} | {r['step']:,} | {r['epochs']:.2f} | "
                f"{r['train_wall_s']:.0f} | {r['elbo_per_row']:.4f} | {r['test_ll']:.4f} ± "
                f"{r['test_ll_se']:.4f} | {gap} | {r['test_rmse']:.4f} | {r['noise_sd_fit']:.4f} "
                f"| {r['peak_rss_mb']:.0f} |"
            )
    if failures:
        lines += [
            "",
            "Runs that failed (the same settings replay the same steps and fail again):",
            "",
        ]
        lines += [
            f"* {_label(f)}, within steps {f['failed_in'][0]:,} to {f['failed_in'][1]:,}: "
            f"{f['error']} (command: `{f['command']}`)"
            for f in failures
        ]
    text = "\n".join(lines) + "\n"
    if png_name:
        text += f"\n![ELBO and test LL against wall time]({png_name})\n"
    return text


def _label(row: dict) -> str:
    if not row.get("natgrad_gamma"):
        return LABELS[row["config"]]
    # rows written before --natgrad-layers existed stepped every layer
    where = {"all": "every layer", "last": "output layer"}.get(
        row.get("natgrad_layers", "all"), row.get("natgrad_layers")
    )
    return LABELS[row["config"]] + f" ({where}, gamma {row['natgrad_gamma']:g})"


def _plot(by_key: dict, ceiling, path: str) -> None:
    """ELBO / row and test LL against wall time, and the test LL again with its y-axis on the band
    where the configurations end (their last values up to the true log density), so that the
    hundredths that tell them apart are legible. Colour: the family; line style: the optimiser."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks import plot_style

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    variants: dict = {}
    ends = []
    for key, rs in by_key.items():
        label = _label(rs[0])
        family = "global" if rs[0]["config"] == "global" else "mean_field"
        colour = plot_style.family_colour(family)
        ls = plot_style.variant_linestyle(variants.setdefault(family, []).__len__())
        variants[family].append(key)
        style = dict(
            color=colour, ls=ls, lw=1.6, marker=plot_style.depth_marker(rs[0].get("depth", 2))
        )
        wall = [w for r in rs for w in r["trace_wall_s"]]
        elbo = [e for r in rs for e in r["trace_elbo_per_row"]]
        axes[0].plot(wall, elbo, lw=0.5, alpha=0.35, color=colour)
        axes[0].plot(
            [r["train_wall_s"] for r in rs], [r["elbo_per_row"] for r in rs], ms=4, **style
        )
        for ax in axes[1:]:
            ax.plot(
                [r["train_wall_s"] for r in rs],
                [r["test_ll"] for r in rs],
                ms=4,
                label=label,
                **style,
            )
        ends.append(rs[-1]["test_ll"])
    if ceiling is not None:
        for ax in axes:
            ax.axhline(
                ceiling,
                color=plot_style.REFERENCE_COLOUR,
                ls="--",
                lw=1,
                label="true log density per row",
            )
    lows = [r["test_ll"] for rs in by_key.values() for r in rs]
    top = ceiling if ceiling is not None else max(lows)
    titles = (
        "ELBO / row (thin: minibatch estimates;\nmarkers: 10,000 fixed rows)",
        "test log-likelihood (10,000 rows)",
        "test log-likelihood: the band where the runs end\n(points below it are off the panel)",
    )
    names = ("ELBO / row (nats)", "test log-likelihood (nats per row)", None)
    for ax, name, title in zip(axes, names, titles):
        ax.set_xlabel("training wall time (s)")
        if name:
            ax.set_ylabel(name)
        ax.set_title(title, fontsize=9)
        ax.set_ylim(top - max(1.0, 1.2 * (top - np.percentile(lows, 10))), top + 0.15)
        ax.grid(alpha=0.3)
    # the band: from 0.02 below the lowest end of a run that got within 0.15 of the top
    near = [e for e in ends if e > top - 0.15] or ends
    band = (np.floor((min(near) - 0.02) * 50) / 50, max(top, max(lows)) + 0.01)
    axes[2].set_ylim(*band)
    axes[2].yaxis.set_major_locator(matplotlib.ticker.MultipleLocator(0.02))
    axes[2].set_ylabel("test log-likelihood (nats per row)")
    axes[1].axhspan(*band, color="0.85", alpha=0.6, lw=0)
    axes[1].set_title(
        "test log-likelihood (10,000 rows;\ngrey: the right panel's band)", fontsize=9
    )
    fig.tight_layout()
    plot_style.legend_outside(fig, where="below", ncol=3, fontsize=9)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


# -- command line ----------------------------------------------------------------------------------


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["worker"]:
        worker(json.loads(argv[1]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", nargs="?", default="run", choices=("run", "report"))
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument(
        "--features", type=int, default=500, help="random Fourier features per generating layer"
    )
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--chunks", type=int, default=6)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--num-inducing", type=int, default=50)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--natgrad-gamma", type=float, default=0.1)
    parser.add_argument(
        "--natgrad-layers",
        choices=("last", "all"),
        default="last",
        help="which layers' q(U) take natural-gradient steps (fit's natgrad_layers)",
    )
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument(
        "--work-dir",
        default=os.path.join(os.path.expanduser("~"), ".cache", "deepgp_gi", "large"),
        help="shards, test rows and checkpoints",
    )
    parser.add_argument("--results", default=os.path.join(RESULTS, "large.jsonl"))
    parser.add_argument("--out", default=os.path.join(RESULTS, "large.md"))
    parser.add_argument("--plot", default=os.path.join(RESULTS, "large.png"))
    parser.add_argument(
        "--fast",
        action="store_true",
        help="a quick check: defaults of 3,000 rows, 20 steps in 2 chunks, batch 200, M = 8",
    )
    parser.add_argument("--no-progress", action="store_true")
    if "--fast" in argv:  # the fast settings are defaults: an option given explicitly still wins
        parser.set_defaults(rows=3000, steps=20, chunks=2, batch=200, num_inducing=8, features=100)
    args = parser.parse_args(argv)
    configs = args.configs.split(",")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        parser.error(f"--configs: unknown {unknown}; choose from {', '.join(CONFIGS)}")
    if args.steps < args.chunks:
        parser.error(f"--steps ({args.steps}) must be at least --chunks ({args.chunks})")
    failed = []
    if args.action == "report":  # the ceiling from the test rows alone: the shards need not exist
        info = ceiling_info(args.features)
    else:
        os.makedirs(args.work_dir, exist_ok=True)
        info = make_data(args.work_dir, args.rows, args.features)
        command = "python " + " ".join(shlex.quote(a) for a in ["benchmarks/large.py"] + argv)
        for name in configs:
            # the key leaves out --steps: a larger --steps with the same chunk length continues a
            # finished run
            key = f"{name}-n{args.rows}-M{args.num_inducing}-b{args.batch}-lr{args.lr:g}" + (
                f"-g{args.natgrad_gamma:g}"
                + ("" if args.natgrad_layers == "all" else f"-{args.natgrad_layers}")
                if name == "mean_field_natgrad"
                else ""
            )
            cfg = dict(
                config=name,
                key=key,
                shards=info["shards"],
                test=info["test"],
                M=args.num_inducing,
                batch=args.batch,
                lr=args.lr,
                natgrad_gamma=args.natgrad_gamma,
                natgrad_layers=args.natgrad_layers,
                steps=args.steps,
                chunks=args.chunks,
                work_dir=args.work_dir,
                results=args.results,
                command=command,
                progress=not args.no_progress,
            )
            try:
                run_config(cfg)
            except RuntimeError as err:  # the others still run; the report lists the failure
                print(err, file=sys.stderr, flush=True)
                failed.append(key)
    print(report(args.results, args.out, args.plot, info))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
