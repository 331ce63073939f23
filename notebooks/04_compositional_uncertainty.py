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
# # Compositional uncertainty: local against global inducing points
#
# Ober & Aitchison (2021), App. J, Fig. A3. Data are drawn from a two-layer deep GP of width 1,
# `y = f_2(f_1(x)) + ε`, so the truth *is* a composition. A two-layer deep GP is fitted with
# local inducing points (a separate `Q(U_l)` per layer, inducing inputs in each layer's own input
# space) and with global inducing points (inducing inputs at the input, propagated through the
# layers, so `Q(U_2 | U_1)` is coupled to the hidden layer's samples). The question is how much
# uncertainty each keeps in the hidden layer `f_1`: a posterior that collapses `f_1` to nearly one
# function cannot express that several compositions explain the data.
#
# **Settings.** `dg.build_deep_gp(depth=2, posterior=...)` with the library's defaults (SE-ARD
# kernels, inner width = input dimension = 1, fixed identity mean on the hidden layer), 20
# inducing points, Adam with learning rate 1e-2, 5 samples per step, 5000 steps (the paper's
# schedule is not stated; this is what the notebook's CPU budget allows). `DEEPGP_GI_QUICK=1`
# shrinks it to a smoke test.

# %%
import os

import matplotlib.pyplot as plt
import numpy as np
import tensorflow as tf

import deepgp_gi as dg

QUICK = os.environ.get("DEEPGP_GI_QUICK") == "1"
STEPS = 50 if QUICK else 5000
METHODS = ["local", "global"]
print(f"QUICK={QUICK}: {STEPS} Adam steps per posterior")

# %% [markdown]
# ## Data from a two-layer, width-1 deep GP
# `f_1 ~ GP(0, k_1)` on the inputs, then `f_2 ~ GP(0, k_2)` evaluated at the values of `f_1`
# (squared-exponential kernels, variance 1, lengthscales 1 and 0.5), noise variance 0.01.
# The draw is made jointly on the training inputs and a plotting grid so that the true
# functions can be drawn.


# %%
def se(a, b, variance, lengthscale):
    return variance * np.exp(-0.5 * (a[:, None] - b[None, :]) ** 2 / lengthscale**2)


def gp_draw(inputs, variance, lengthscale, rng):
    K = se(inputs, inputs, variance, lengthscale) + 1e-8 * np.eye(len(inputs))
    return np.linalg.cholesky(K) @ rng.standard_normal(len(inputs))


rng = np.random.default_rng(6)
N = 100
x_train = np.sort(rng.uniform(-3, 3, N))
x_grid = np.linspace(-4, 4, 200)
x_all = np.concatenate([x_train, x_grid])
f1_all = gp_draw(x_all, 1.0, 1.0, rng)
f2_all = gp_draw(f1_all, 1.0, 0.5, rng)
X = x_train[:, None]
Y = (f2_all[:N] + 0.1 * rng.standard_normal(N))[:, None]
f1_true, f2_true = f1_all[N:], f2_all[N:]
print(f"N = {N}; true f_1 spans [{f1_all.min():.2f}, {f1_all.max():.2f}] on the grid")

# %% [markdown]
# ## Fit both posteriors

# %%
models, histories = {}, {}
for method in METHODS:
    model = dg.build_deep_gp(X, Y, depth=2, posterior=method, num_inducing=20, seed=0)
    histories[method] = dg.fit(
        model, (X, Y), steps=STEPS, learning_rate=1e-2, num_samples=5, seed=0, progress=False
    )
    models[method] = model
    print(f"{method:>7}: training ELBO estimate at the last step {histories[method].elbo[-1]:.1f}")

# %% [markdown]
# ## Per-layer function samples
# Ten joint samples of each layer (`model.sample_layers`): the hidden layer `f_1(x)` (left) and
# the output `f_2(f_1(x))` (middle), and the output layer as a function of the hidden one (right,
# each sample's points `(f_1(x), f_2)` on the grid). A deep GP is identifiable only up to
# invertible reparameterisations of the hidden layer (e.g. `f_1 → −f_1` with `f_2` mirrored), so
# the fitted `f_1` need not match the true one; the spread of the samples is what matters.
# Each layer's samples are drawn point by point given that layer's sampled inducing outputs (as
# in training), so they look jagged where the conditional variance is large, away from the data.

# %%
tf.random.set_seed(0)
samples = {
    m: [F.numpy()[..., 0] for F in models[m].sample_layers(x_grid[:, None], num_samples=10)]
    for m in METHODS
}
fig, axes = plt.subplots(2, 3, figsize=(16, 8))
for row, method in zip(axes, METHODS):
    F1, F2 = samples[method]
    for s in range(F1.shape[0]):
        lab = "posterior sample" if s == 0 else None
        row[0].plot(x_grid, F1[s], "C1", alpha=0.6, lw=1, label=lab)
        row[1].plot(x_grid, F2[s], "C1", alpha=0.6, lw=1, label=lab)
        row[2].plot(F1[s], F2[s], "C1", alpha=0.6, lw=1, label=lab)
    row[0].plot(x_grid, f1_true, "k--", label="true $f_1$")
    row[1].plot(x_grid, f2_true, "k--", label="true $f_2(f_1(x))$")
    row[1].plot(X[:, 0], Y[:, 0], "k.", ms=4, label="data")
    row[2].plot(f1_true, f2_true, "k--", label="true $f_2$ against true $f_1$")
    row[0].set(title=f"{method} inducing: hidden layer $f_1(x)$", xlabel="x", ylabel="$f_1$")
    row[1].set(title=f"{method} inducing: output $f_2(f_1(x))$", xlabel="x", ylabel="$f_2$")
    row[2].set(
        title=f"{method} inducing: output against hidden layer", xlabel="$f_1$", ylabel="$f_2$"
    )
    for ax in row:
        ax.legend(fontsize=8, loc="best")
plt.tight_layout()

# %% [markdown]
# ## ELBOs and how much uncertainty each layer keeps
# ELBO: mean of 20 estimates with 10 samples each (± standard error), total over the data.
# Spread: the standard deviation across 100 joint samples of each layer's value, averaged over
# the training inputs and over the grid.

# %%
tf.random.set_seed(1)
summary = {}
for method, model in models.items():
    estimates = np.array([float(model.elbo((X, Y), 10)) for _ in range(20)])
    F1_data, F2_data = [F.numpy()[..., 0] for F in model.sample_layers(X, num_samples=100)]
    F1_grid, F2_grid = [
        F.numpy()[..., 0] for F in model.sample_layers(x_grid[:, None], num_samples=100)
    ]
    summary[method] = dict(
        elbo=estimates.mean(),
        se=estimates.std() / np.sqrt(len(estimates)),
        f1_sd_data=F1_data.std(0).mean(),
        f2_sd_data=F2_data.std(0).mean(),
        f1_sd_grid=F1_grid.std(0).mean(),
        f2_sd_grid=F2_grid.std(0).mean(),
        f1_range=np.ptp(F1_grid.mean(0)),
    )
print(
    f"{'posterior':>9} | {'ELBO':>15} | {'ELBO/N':>7} | sd f1 (data) | sd f2 (data) | sd f1 "
    "(grid) | sd f2 (grid) | range of mean f1 | sd f1 / range"
)
for method, s in summary.items():
    print(
        f"{method:>9} | {s['elbo']:8.2f} ± {s['se']:4.2f} | {s['elbo'] / N:7.3f} | "
        f"{s['f1_sd_data']:12.3f} | {s['f2_sd_data']:12.3f} | {s['f1_sd_grid']:12.3f} | "
        f"{s['f2_sd_grid']:12.3f} | {s['f1_range']:16.3f} | {s['f1_sd_data'] / s['f1_range']:13.3f}"
    )
ratio = summary["global"]["f1_sd_data"] / summary["local"]["f1_sd_data"]
print(
    f"hidden-layer sd at the data, global / local: {ratio:.2f}; "
    f"ELBO difference global − local: {summary['global']['elbo'] - summary['local']['elbo']:.2f}"
)

# %% [markdown]
# ## Conclusion (full run, numbers from the cells above)
#
# Both posteriors fit the data equally well on the output layer (sd of `f_2` at the data 0.057
# for local and 0.052 for global inducing), but they differ in the hidden layer, as in App. J
# Fig. A3. Local inducing collapses `f_1` to almost one function: its sd across samples at the
# training inputs is 0.072, about 1% of the range of its mean `f_1` (7.9). Global inducing keeps
# a family of hidden functions, each paired with a matching output function (right-hand
# panels): sd 0.522 at the training inputs, 7.3 times local inducing's and 6% of its range
# (8.7). This compositional uncertainty is not bought with a worse fit: the global-inducing
# ELBO is higher, 22.25 ± 0.06 against 13.49 ± 0.35 (total over the 100 points; 0.222 against
# 0.135 per point). Neither fitted `f_1` equals the true one, which is expected since the
# hidden layer is identifiable only up to reparameterisation.
