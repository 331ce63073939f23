# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 · UCI benchmarks: our results beside the papers'
#
# This notebook trains nothing: it reads the result lines that `benchmarks/uci.py sweep` appended to
# `benchmarks/results/uci/*.jsonl` (one JSON line per configuration and split) and shows
#
# * the tables of `benchmarks/uci.py report` (mean ± one standard error over splits, the paper's
#   number beside ours, and whether ours is within two standard errors),
# * test log-likelihood and ELBO per dataset and method (like O&A Fig. 3),
# * the training ELBO against step for mean-field and global inducing on boston and energy,
# * Lindinger et al.'s extrapolation protocol: mean-field, stripes-and-arrow and fully-coupled
#   compared point by point, and their calibration curves.
#
# The papers' numbers come from `benchmarks/results/uci/paper_reference.csv` (O&A 2021 Tables 5–10,
# Lindinger et al. 2020 Table 1). How the sweep was run, and where it deviates from the papers
# (fewer steps and splits), is in `benchmarks/results/uci/README.md`.

# %%
import importlib.util
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Image, Markdown, display

from deepgp_gi import metrics as dg_metrics

ROOT = Path.cwd()
while not (ROOT / "benchmarks" / "uci.py").exists() and ROOT != ROOT.parent:
    ROOT = ROOT.parent
RESULTS = ROOT / "benchmarks" / "results" / "uci"
spec = importlib.util.spec_from_file_location("uci_benchmark", ROOT / "benchmarks" / "uci.py")
uci = importlib.util.module_from_spec(spec)
spec.loader.exec_module(uci)

all_records = [r for f in sorted(RESULTS.glob("*.jsonl")) for r in uci.read_records(str(f))]
records = [r for r in all_records if r["protocol"] == "random"]
extrapolation = [r for r in all_records if r["protocol"] == "extrapolation"]
reference = uci.load_reference(str(RESULTS / "paper_reference.csv"))
rows = uci.summarise(records, reference)
print(f"{len(records)} result lines, {len(rows)} table rows; code commits: {sorted({r.get('commit') for r in records})}")


def md_table(header, body):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return Markdown("\n".join(lines))


method = uci._method  # e.g. "global (softplus)" for lines trained before global's default became exp


def fmt(m, se):
    return "—" if not np.isfinite(m) else (f"{m:.3f} ± {se:.3f}" if np.isfinite(se) else f"{m:.3f} (1 split)")


def verdict(ok, n_splits):
    return "—" if ok is None else ("yes" if ok else "no") + ("*" if n_splits == 1 else "")


order = sorted(rows, key=lambda s: (s["model"], s["dataset"], s["depth"], method(s), s["steps"]))

# %% [markdown]
# ## What has been run
#
# One row per configuration: how many splits are done, the step count (the papers use 20,000 for deep
# GPs and 10,000 for BNNs), the median time per Adam step on the shared machine and the largest
# standard error of a line's ELBO estimate.

# %%
md_table(["model", "dataset", "method", "depth", "M", "steps", "splits", "ms/step", "max ELBO SE"],
         [[s["model"], s["dataset"], method(s), s["depth"], s["num_inducing"], s["steps"], len(s["splits"]),
           f"{s['ms_per_step']:.1f}", f"{s['elbo_se_max']:.4f}"] for s in order])

# %% [markdown]
# ## Test log-likelihood, RMSE and ELBO beside the papers
#
# `ours` and `paper` are mean ± SE over splits; `≤2SE` is |ours − paper| ≤ 2·sqrt(SE_ours² + SE_paper²)
# (with a single split only the paper's SE).

# %%
for metric, label in uci.METRICS:
    display(Markdown(f"### {label}"))
    display(md_table(
        ["model", "dataset", "method", "depth", "steps", "splits", "ours", "paper", "ours − paper", "≤2SE"],
        [[s["model"], s["dataset"], method(s), s["depth"], s["steps"], len(s["splits"]), fmt(*s[metric]),
          fmt(*s["paper_" + metric][:2]) if s["paper_" + metric] else "—",
          f"{s[metric][0] - s['paper_' + metric][0]:+.3f}" if s["paper_" + metric] else "—",
          verdict(s["ok_" + metric], len(s["splits"]))]
         for s in order]))
    display(Markdown("`*`: one split of ours; its SE is taken as the paper's split-to-split SD, SE_paper·√20."))

# %% [markdown]
# ## Global inducing against mean-field
#
# The papers' central finding: global inducing's ELBO is at least mean-field's at the same depth
# (global with the library's current default, the exp transform of the kernel hyperparameters).

# %%
gp = {(s["dataset"], s["depth"], s["steps"], method(s)): s for s in rows if s["model"] == "gp"}
comp = []
for (d, depth, steps, post), s in sorted(gp.items()):
    if post == "global" and (d, depth, steps, "mean_field") in gp:
        mf = gp[(d, depth, steps, "mean_field")]
        comp.append([d, depth, steps, f"{len(mf['splits'])} / {len(s['splits'])}", fmt(*mf["elbo_per_datapoint"]),
                     fmt(*s["elbo_per_datapoint"]),
                     "yes" if s["elbo_per_datapoint"][0] >= mf["elbo_per_datapoint"][0] else "no",
                     fmt(*mf["test_ll"]), fmt(*s["test_ll"])])
md_table(["dataset", "depth", "steps", "splits (mf / gi)", "ELBO/N mean_field", "ELBO/N global", "gi ≥ mf",
          "test LL mean_field", "test LL global"], comp)

# %% [markdown]
# ## Plots
#
# One figure per data set: ours (filled circles, mean ± SE over splits) and the papers' (open squares),
# a row per configuration, coloured by family.

# %%
for metric, prefix, label in uci.PLOTTED_METRICS:
    display(Markdown(f"### {label}"))
    for dataset in sorted({s["dataset"] for s in rows}):
        path = RESULTS / f"{prefix}_{dataset}.png"
        if path.exists():
            display(Image(str(path)))
        else:
            print(f"{path.name} not generated yet: run {uci.REPORT_COMMAND}")

# %% [markdown]
# ## Convergence: training ELBO against Adam step (split 0, depth 2)
#
# Solid: runs with the papers' 20,000 steps; dotted: the 5,000-step runs of the split sweep. The dashed
# lines are the papers' final ELBOs (means over 20 splits). The table after the plot gives the first step
# at which the (block-averaged) training ELBO has made 99% of its improvement from the start to its
# final value.

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
for ax, d in zip(axes, ("boston", "energy")):
    for c, post in enumerate(("mean_field", "global")):
        for r in sorted([r for r in records if r["model"] == "gp" and r["dataset"] == d and r["posterior"] == post
                         and r["depth"] == 2 and r["split"] == 0], key=lambda r: r["steps"]):
            old = method(r) != post  # trained with a transform other than the family's current default
            ax.plot(r["trace"]["step"], r["trace"]["elbo_per_datapoint"], "-" if r["steps"] >= 20000 else ":",
                    color=f"C{c}", alpha=0.4 if old else 1.0, label=f"{method(r)}, {r['steps']} steps")
        p = reference.get(("gp", d, post, 2, None), {}).get("elbo_per_datapoint")
        if p:
            ax.axhline(p[0], ls="--", lw=1, color=f"C{c}", label=f"{post}: paper")
    vals = [v for line in ax.get_lines() for v in line.get_ydata()]
    if vals:
        lo = np.percentile(vals, 5)
        ax.set_ylim(lo - 0.2 * (max(vals) - lo), max(vals) + 0.1 * (max(vals) - lo + 1e-9))
    ax.set(title=f"{d}, depth 2, split 0", xlabel="Adam step", ylabel="training ELBO per datapoint")
    ax.legend(fontsize=7)
plt.tight_layout()
plt.show()

# %%
conv = []
for s in order:
    vals = [v for v in s["steps_to_99"] if v is not None]
    if vals:
        conv.append([s["model"], s["dataset"], method(s), s["depth"], s["steps"], len(vals), f"{np.mean(vals):.0f}"])
md_table(["model", "dataset", "method", "depth", "steps run", "splits", "steps to 99%"], conv)

# %% [markdown]
# ## Extrapolation (Lindinger et al. 2020)
#
# `dg.datasets.load_uci(name, split=k, protocol="extrapolation")`: train on the lower half of a random
# 1-D projection of the inputs, test on the upper half. The tables are the report's; the plot shows the
# observed coverage of the central predictive intervals against their nominal probability (points on the
# diagonal are calibrated, below it overconfident), pooled over the splits run.

# %%
if extrapolation:
    text = uci.render_extrapolation(extrapolation)
    display(Markdown(text.split("Plot:")[0]))
    runs = uci._extrapolation_runs(extrapolation)
    names = sorted({k[0] for k in runs})
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 4), squeeze=False)
    for ax, d in zip(axes[0], names):
        for i, ((d2, depth, steps, m), rs) in enumerate(sorted(runs.items())):
            if d2 == d:
                lv, ob = dg_metrics.calibration_curve(np.concatenate([r["test_pit"] for r in rs]))
                ax.plot(np.r_[0, lv], np.r_[0, ob], "o-", ms=3, color=f"C{i}", label=f"{m}-{depth}, {len(rs)} splits")
        ax.plot([0, 1], [0, 1], "k--", lw=1)
        ax.set(title=f"{d}, extrapolation", xlabel="nominal coverage", ylabel="observed coverage")
        ax.legend(fontsize=7)
    plt.tight_layout()
    plt.show()
else:
    print("no extrapolation lines yet")
