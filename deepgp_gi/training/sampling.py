"""``collect_samples``: continue a sampling family's chain and keep thinned samples."""

from __future__ import annotations

from typing import List, Optional

import numpy as np
import tensorflow as tf
from tqdm.auto import tqdm

from ..models import DeepGP
from ..posteriors.sghmc import check_momentum_decay
from ..validation import check_positive_float, check_positive_int, resolve_seed
from .loop import check_fit_arguments, plan_batches
from .step import SamplerStep

__all__ = ["collect_samples"]

#: The noise stream of ``collect_samples`` (``fit``'s batches and draws use streams 1 and 2).
_COLLECT_STREAM = 3


def collect_samples(
    model: DeepGP,
    data,
    *,
    num_samples: int = 100,
    thin: int = 50,
    seed: Optional[int] = 0,
    batch_size: Optional[int] = None,
    num_hidden_samples: int = 1,
    jit_compile: bool = False,
    progress: bool = True,
    step_size: Optional[float] = None,
    momentum_decay: Optional[float] = None,
) -> List[tf.Tensor]:
    """Continue the chain of a sampling posterior (``posterior="sghmc"`` or ``"bsgp"``) for
    ``num_samples * thin`` steps and keep every ``thin``-th state (Havasi et al. 2018: 100 samples
    50 steps apart after training).

    The hyperparameters are frozen and the preconditioner and friction no longer adapt (the
    statistics ``fit`` adapted are used as they are), so the chain is a fixed SGHMC kernel whose
    stationary distribution is the posterior of the inducing outputs
    (:mod:`deepgp_gi.posteriors.sghmc`). The samples are stored on ``model.posterior``
    (``posterior.samples``); ``predict_f``, ``predict_y``, ``predict_log_density``,
    ``sample_layers`` and the metrics then mix over them (before, they use the window of the last
    training states). A later ``fit`` discards them.

    :param model: a :class:`~deepgp_gi.DeepGP` with a sampling posterior.
    :param data: ``(X, Y)`` arrays (or a ``tf.data.Dataset`` of batches, as for ``fit``).
    :param num_samples: how many samples to keep.
    :param thin: chain steps per kept sample.
    :param seed: seeds the minibatches and the chain's draws (a stream of its own, not ``fit``'s).
    :param batch_size: minibatch size for array data (``None``: the full data set).
    :param num_hidden_samples: hidden-layer draws per gradient (``fit``'s ``num_samples``).
    :param jit_compile: compile the step with XLA.
    :param progress: show a progress bar.
    :param step_size: the chain's ``eps`` while collecting (``None``: the posterior's
        ``step_size``). Any fixed step leaves the target in place up to the discretisation; a
        larger one mixes faster in weakly determined directions (``docs/sampling.md``).
    :param momentum_decay: the chain's ``alpha`` while collecting (``None``: the posterior's).
    :return: one ``[num_samples, M, D_l]`` tensor of whitened inducing outputs per layer (a family
        that samples more, ``posterior="bsgp"``, stores the rest of each sample on the posterior).
    """
    if not isinstance(model, DeepGP):
        raise TypeError(f"model must be a deepgp_gi.DeepGP, got {type(model).__name__}")
    if not getattr(model.posterior, "is_sampler", False):
        raise ValueError(
            f"collect_samples needs a sampling posterior (posterior='sghmc'); model.posterior is a "
            f"{type(model.posterior).__name__}, a variational family with no chain to continue"
        )
    num_samples = check_positive_int(num_samples, "num_samples")
    thin = check_positive_int(thin, "thin")
    num_hidden_samples = check_positive_int(num_hidden_samples, "num_hidden_samples")
    seed = resolve_seed(seed, "seed")
    if step_size is not None:
        step_size = check_positive_float(step_size, "step_size")
    if momentum_decay is not None:
        momentum_decay = check_momentum_decay(momentum_decay)
    if not isinstance(jit_compile, bool):
        raise TypeError(f"jit_compile must be True or False, got {jit_compile!r}")
    steps = num_samples * thin
    plan = check_fit_arguments(
        model,
        data,
        steps=steps,
        batch_size=batch_size,
        learning_rate=1.0,
        num_samples=num_hidden_samples,
        seed=seed,
        log_every=1,
    )
    posterior = model.posterior
    step = SamplerStep(
        model,
        None,
        [],
        tf.Variable(0, dtype=tf.int64, trainable=False),
        adapt=False,
        stream=_COLLECT_STREAM,
        num_samples=plan.num_samples,
        seed=plan.seed,
        jit_compile=jit_compile,
        step_size=step_size,
        momentum_decay=momentum_decay,
    )
    kept: List[List[tf.Tensor]] = [[] for _ in posterior.chain_variables()]
    bar = tqdm(total=steps, disable=not progress, desc="collect_samples", dynamic_ncols=True)
    done = 0
    try:
        for t, X_b, Y_b in plan_batches(plan, data, 0, model.dtype):
            log_joint = step(t, X_b, Y_b)
            done = int(t.numpy()) + 1
            if done % thin == 0:
                step.raise_if_failed()
                value = float(log_joint.numpy())
                if not np.isfinite(value):
                    raise FloatingPointError(
                        f"the log joint became {value} at collection step {done}"
                    )
                for store, V in zip(kept, posterior.chain_variables()):
                    store.append(tf.identity(V.read_value()))
            bar.update(1)
    finally:
        bar.close()
    if done < steps:
        raise ValueError(
            f"the data ran out after step {done} of {steps}: the tf.data.Dataset yielded no more "
            "batches"
        )
    step.raise_if_failed()
    samples = [tf.stack(store) for store in kept]
    posterior.store_samples(samples)  # the whole chain state (BSGP: V, Z and hyperparameters)
    return samples[: len(posterior.inducing_outputs)]
