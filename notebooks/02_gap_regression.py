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
# # Gap regression: factorised, local and global inducing BNNs against HMC
#
# Ober & Aitchison (2021), Fig. 1 and App. J Table 2. Forty points with inputs in
# [-4, -2] ∪ [2, 4] and outputs `y = x³ + ε`, `ε ~ N(0, 3²)`, standardised; a 2×50 ReLU BNN with
# the Neal prior (weights `N(0, 1/fan_in)`, bias included in the fan-in) and the noise variance
# fixed at its true value. Three variational posteriors (`dg.build_bnn(posterior=...)`):
# factorised (mean-field over weights), local inducing and global inducing, with M = 100
# inducing points; and a Hamiltonian Monte Carlo reference under the same prior and noise
# (TensorFlow Probability). The question of the figure: which posterior keeps the uncertainty
# in the gap between the two clusters of data?
#
# **Settings.** Full-batch Adam, learning rate 1e-2, 10 training samples, as in the paper, but
# 2000 steps instead of the paper's 5000 (CPU budget of a notebook); the ELBO is evaluated with
# 100 samples. `DEEPGP_GI_QUICK=1` shrinks everything to a smoke test.

# %%
import os
import time

import gpflow
import matplotlib.pyplot as plt
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

import deepgp_gi as dg

QUICK = os.environ.get("DEEPGP_GI_QUICK") == "1"
STEPS = 30 if QUICK else 2000
HMC_BURNIN, HMC_RESULTS, HMC_CHAINS, HMC_LEAPFROG = (50, 50, 2, 5) if QUICK else (1000, 1000, 4, 20)
ELBO_SAMPLES = 20 if QUICK else 100
METHODS = ["factorised", "local", "global"]
#: O&A App. J Table 2: ELBO, V[F1], V[F2], V[F3].
PAPER = {
    "factorised": (-4.585, 0.0728, 0.4765, 0.1926),
    "local": (-5.469, 0.0763, 0.4473, 0.0643),
    "global": (2.236, 0.4820, 0.4877, 1.0820),
}
print(
    f"QUICK={QUICK}: {STEPS} Adam steps per posterior; HMC {HMC_CHAINS} chains x "
    f"({HMC_BURNIN} burn-in + {HMC_RESULTS}) x {HMC_LEAPFROG} leapfrog steps"
)

# %% [markdown]
# ## Data (standardised) and the noise variance in standardised units

# %%
X_raw, Y_raw = dg.datasets.gap_regression(40, seed=0)
x_mean, x_std, y_mean, y_std = X_raw.mean(), X_raw.std(), Y_raw.mean(), Y_raw.std()
X, Y = (X_raw - x_mean) / x_std, (Y_raw - y_mean) / y_std
NOISE_VAR = float((3.0 / y_std) ** 2)
x_grid_raw = np.linspace(-6, 6, 241)[:, None]
x_grid = (x_grid_raw - x_mean) / x_std
in_gap = np.abs(x_grid_raw[:, 0]) < 1.9  # raw x in (-1.9, 1.9)
on_data = (np.abs(x_grid_raw[:, 0]) >= 2) & (np.abs(x_grid_raw[:, 0]) <= 4)
print(f"N = {len(X)}, noise variance (standardised) = {NOISE_VAR:.5f}")

# %% [markdown]
# ## Variational posteriors
# `dg.build_bnn` builds the 2×50 ReLU network as a deep GP; with M = 100 > N the inducing
# inputs start at `U_0 ~ N(0, 1)` (the paper's toy set-up). `dg.fit` runs full-batch Adam.

# %%
models, fit_seconds = {}, {}
for method in METHODS:
    likelihood = gpflow.likelihoods.Gaussian(variance=NOISE_VAR)
    gpflow.set_trainable(likelihood, False)
    # global inducing with O&A's sampled last-layer weights (the outputs below were made with it);
    # the library's default integrates them out (docs/global_inducing.md)
    options = {"last_layer": "sampled"} if method == "global" else {}
    model = dg.build_bnn(
        X,
        Y,
        hidden=(50, 50),
        posterior=method,
        prior="neal",
        num_inducing=100,
        likelihood=likelihood,
        seed=0,
        **options,
    )
    start = time.time()
    dg.fit(model, (X, Y), steps=STEPS, learning_rate=1e-2, num_samples=10, seed=0, progress=False)
    fit_seconds[method] = time.time() - start
    models[method] = model
    print(f"{method:>10}: {STEPS} steps in {fit_seconds[method]:.0f} s")

# %% [markdown]
# ## HMC reference
# The same network written directly in TensorFlow: weights `W_l = Z_l / sqrt(fan_in_l)` with
# `Z_l ~ N(0, 1)` (the Neal prior, sampled in whitened coordinates for better conditioning),
# layer 0 linear in `[x, 1]`, ReLU before layers 1 and 2, Gaussian likelihood with the same
# fixed noise. Several chains started from the prior, step size adapted by dual averaging
# during burn-in (target acceptance 0.75).

# %%
widths = [1, 50, 50, 1]
fan_in = [w + 1 for w in widths[:-1]]


def bnn_forward(zs, x):
    """f for a batch of weight samples: zs[l] is [C, fan_in_l, width_{l+1}], x is [N, 1]."""
    h = tf.broadcast_to(tf.constant(x)[None], [tf.shape(zs[0])[0], x.shape[0], 1])
    for l, z in enumerate(zs):
        if l > 0:
            h = tf.nn.relu(h)
        h = tf.concat([h, tf.ones_like(h[..., :1])], axis=-1)
        h = tf.matmul(h, z) / np.sqrt(fan_in[l])
    return h


def log_joint(*zs):
    f = bnn_forward(zs, X)
    log_prior = sum(-0.5 * tf.reduce_sum(z**2, axis=[-2, -1]) for z in zs)
    log_lik = tf.reduce_sum(
        -0.5 * (Y[None] - f) ** 2 / NOISE_VAR - 0.5 * np.log(2 * np.pi * NOISE_VAR), axis=[-2, -1]
    )
    return log_prior + log_lik


init = [
    tf.constant(np.random.default_rng(1).standard_normal((HMC_CHAINS, fan_in[l], widths[l + 1])))
    for l in range(3)
]
hmc = tfp.mcmc.DualAveragingStepSizeAdaptation(
    tfp.mcmc.HamiltonianMonteCarlo(
        log_joint,
        step_size=tf.fill([HMC_CHAINS, 1, 1], tf.constant(1e-3, tf.float64)),
        num_leapfrog_steps=HMC_LEAPFROG,
    ),
    num_adaptation_steps=int(0.8 * HMC_BURNIN),
)


@tf.function(jit_compile=True)
def run_chains():
    return tfp.mcmc.sample_chain(
        HMC_RESULTS,
        init,
        kernel=hmc,
        num_burnin_steps=HMC_BURNIN,
        trace_fn=lambda _, pkr: pkr.inner_results.is_accepted,
        seed=[0, 1],
    )


start = time.time()
hmc_samples, accepted = run_chains()
fit_seconds["HMC"] = time.time() - start
print(
    f"HMC: {fit_seconds['HMC']:.0f} s, acceptance rate per chain "
    f"{np.round(accepted.numpy().mean(0), 3)}"
)

# %% [markdown]
# ## Predictive distributions
# Mean and ±2 standard deviations of `f` (dark band) and of `y` (light band, noise included),
# in the original units, from 100 samples (variational) or every 10th HMC draw of every chain.

# %%
tf.random.set_seed(0)
pred = {}
for method, model in models.items():
    mean, var = model.predict_f(x_grid, num_samples=100)
    pred[method] = (mean.numpy()[:, 0], var.numpy()[:, 0])
thin = [s[::10] for s in hmc_samples]  # [R/10, C, ...]
flat = [tf.reshape(s, [-1] + list(s.shape[2:])) for s in thin]
f_hmc = bnn_forward(flat, x_grid).numpy()[..., 0]  # [R/10 * C, grid]
pred["HMC"] = (f_hmc.mean(0), f_hmc.var(0))

fig, axes = plt.subplots(1, 4, figsize=(18, 4), sharey=True)
titles = {
    "factorised": "factorised",
    "local": "local inducing",
    "global": "global inducing",
    "HMC": "HMC (reference)",
}
for ax, (method, (m, v)) in zip(axes, pred.items()):
    m_raw, sd_f, sd_y = m * y_std + y_mean, np.sqrt(v) * y_std, np.sqrt(v + NOISE_VAR) * y_std
    ax.fill_between(
        x_grid_raw[:, 0],
        m_raw - 2 * sd_y,
        m_raw + 2 * sd_y,
        color="C0",
        alpha=0.2,
        label="±2 sd of y",
    )
    ax.fill_between(
        x_grid_raw[:, 0],
        m_raw - 2 * sd_f,
        m_raw + 2 * sd_f,
        color="C0",
        alpha=0.45,
        label="±2 sd of f",
    )
    ax.plot(x_grid_raw[:, 0], m_raw, "C0", label="mean")
    ax.plot(X_raw[:, 0], Y_raw[:, 0], "k.", ms=5, label="data")
    ax.set(title=titles[method], xlabel="x", ylim=(-150, 150))
    ax.legend(loc="upper left", fontsize=8)
axes[0].set_ylabel("y")
plt.tight_layout()

# %% [markdown]
# ## ELBOs and intermediate-function variances beside App. J Table 2
# ELBO: total over the 40 points, the mean of `ELBO_SAMPLES` single-sample estimates ± its
# standard error. `V[F_l] = E_x[(1/N_l) Σ_λ Var f_λ^l(x)]` with `x ~ N(0, 1)` (standardised
# inputs), from 100 joint samples. Predictive sd of `f` (standardised units) averaged over the
# grid points in the gap (|x| < 1.9) and on the data (2 ≤ |x| ≤ 4).

# %%
rows = []
x_vf = np.random.default_rng(0).standard_normal((200, 1))
for method, model in models.items():
    tf.random.set_seed(1)
    estimates = np.array([float(model.elbo((X, Y), 1)) for _ in range(ELBO_SAMPLES)])
    layers = model.sample_layers(x_vf, num_samples=100)
    v_f = [float(tf.reduce_mean(tf.math.reduce_variance(F, axis=0))) for F in layers]
    sd = np.sqrt(pred[method][1])
    rows.append(
        dict(
            method=method,
            elbo=estimates.mean(),
            se=estimates.std() / np.sqrt(len(estimates)),
            v_f=v_f,
            gap_sd=sd[in_gap].mean(),
            data_sd=sd[on_data].mean(),
        )
    )
sd_hmc = np.sqrt(pred["HMC"][1])
hmc_gap_sd, hmc_data_sd = sd_hmc[in_gap].mean(), sd_hmc[on_data].mean()

print(
    f"{'method':>10} | {'ELBO (ours)':>17} | {'ELBO/pt':>7} | {'ELBO (paper)':>12} | "
    f"{'V[F1..3] (ours)':>22} | {'V[F1..3] (paper)':>22} | sd f gap | sd f data"
)
for r in rows:
    p = PAPER[r["method"]]
    print(
        f"{r['method']:>10} | {r['elbo']:9.2f} ± {r['se']:5.2f} | {r['elbo'] / len(X):7.3f} | "
        f"{p[0]:12.3f} | {', '.join(f'{v:.3f}' for v in r['v_f']):>22} | "
        f"{', '.join(f'{v:.3f}' for v in p[1:]):>22} | {r['gap_sd']:8.3f} | {r['data_sd']:9.3f}"
    )
print(
    f"{'HMC':>10} | {'—':>17} | {'—':>7} | {'—':>12} | {'—':>22} | {'—':>22} | "
    f"{hmc_gap_sd:8.3f} | {hmc_data_sd:9.3f}"
)
ranking_ours = [r["method"] for r in sorted(rows, key=lambda r: -r["elbo"])]
ranking_paper = sorted(METHODS, key=lambda m: -PAPER[m][0])
print("ELBO ranking, ours:", " > ".join(ranking_ours), "| paper:", " > ".join(ranking_paper))

# %% [markdown]
# ## Conclusion (full run, numbers from the cells above)
#
# **The figure.** Global inducing reproduces the HMC reference: the predictive sd of `f`
# (standardised units) is 0.129 in the gap against HMC's 0.120, and 0.037 on the data against
# HMC's 0.032. The factorised posterior has the opposite shape: *less* uncertainty in the gap
# (0.046) than on the data (0.106), i.e. it interpolates the gap with false confidence. Local
# inducing did not fit the left cluster within the 2000 steps of this run (see its panel); its
# gap sd is 0.075.
#
# **The table.** The ELBO ranking is the paper's: global (-64.90 ± 1.15) > factorised
# (-233.99 ± 1.06) > local (-599.31 ± 4.08). The absolute values are not: the paper reports
# 2.236, -4.585 and -5.469, and ours are lower by about 67, 229 and 594 nats in total over the
# 40 points (-1.62, -5.85 and -14.98 per point, which matches the paper's numbers on neither
# scale). The library's own benchmark (`benchmarks/results/gap_regression.md`, 5000 steps) found
# the same gap in scale (-66.2, -214.6, -303.9); the local-inducing value here is further off
# because 2000 steps are too few for it. The intermediate-function variances do not match
# either: for global inducing ours are 0.818, 0.374, 0.012 against the paper's 0.482, 0.488,
# 1.082 (the output-layer variance differs most); for factorised and local our V[F1] is larger
# and V[F2], V[F3] smaller than the paper's. We have not resolved these differences; the
# qualitative result of Fig. 1 (global inducing ≈ HMC in and out of the gap, factorised
# overconfident in the gap) is reproduced.
