"""Convolutional BNNs on images: factorised vs global inducing vs fac->gi, Neal vs SpatialIW.

Every (posterior, prior, seed) cell trains ``build_conv_bnn`` and appends one JSON line: test
accuracy, test log-likelihood, expected calibration error (15 bins), predictive entropy, the
ELBO per training image, and milliseconds per step. A cell already in the results file is
skipped, and a cell whose run is interrupted resumes from its checkpoint, so the sweep can be
stopped and restarted at will. ``report`` writes the table (mean +- standard error over seeds).

Digits (default; bundled, 1,500 train / 297 test 8x8 images):

    python benchmarks/images.py sweep --out benchmarks/results/images/digits.jsonl
    python benchmarks/images.py report --results benchmarks/results/images/digits.jsonl \
        --out benchmarks/results/images/digits.md

MNIST / CIFAR-10 with the paper's settings (O&A 2021 App. O: ResNet, M = 500, batch 500, Adam
1e-2, KL tempering, 1 training / 10 test samples) for a machine with a GPU and the files:

    python benchmarks/images.py sweep --dataset cifar10 --path ~/data/cifar-10-batches-py --paper \
        --out results/cifar10.jsonl

Inducing weights (Ritter et al. 2021; every conv and dense layer, ``--num-inducing`` is M) on
the digits, written to their own file with the FFG-W (factorised) reference:

    nice -n 19 python benchmarks/images.py sweep \
        --posteriors ffg_u,ensemble_u,factorised,ensemble_w --priors neal --seeds 0 \
        --num-inducing 16 --out benchmarks/results/images/digits_inducing_weights.jsonl

Every row records the number of variational parameters (``dg.parameter_count``).

Long runs with a trace: ``--lr-decay RATE,EVERY`` multiplies Adam's learning rate by RATE every
EVERY steps (a staircase, part of the cell's key), and ``--eval-every N`` (with
``--checkpoint-dir``) trains each cell in segments of N steps, each resuming from the checkpoint
of the one before, appending after each segment one line to the trace file (``--trace``, default
``x_trace.jsonl`` beside ``x.jsonl``): the step, the epoch (step x batch / N_train), test
accuracy, test log-likelihood, ECE and entropy with ``--trace-samples`` samples, and the segment's
ms/step. The checkpoint folder of a segmented run does not name its steps (except under the
``linear`` KL schedule, whose ramp is 10% of them), so an interrupted run, or a later sweep with
more steps, continues the run and its trace; a run traced past the checkpoint its folder holds
stops with an error (``--drop-lost-trace``: drop those trace lines and train the steps again).
``report --plot`` then draws accuracy, test LL and
ECE against epochs from the traces (mean over seeds, a band from the lowest to the highest seed):

    nice -n 19 python benchmarks/images.py sweep --dataset mnist \
        --posteriors factorised,ffg_u,global --priors neal --seeds 0,1,2 --steps 3600 \
        --batch-size 500 --lr 0.01 --lr-decay 0.5,1200 --eval-every 240 --kl-schedule linear \
        --elbo-rows 5000 --checkpoint-dir <dir> --out benchmarks/results/images/mnist_long.jsonl

and the same with ``--posteriors global --priors spatial_iw`` (see
benchmarks/results/images/README.md).

Augmentation: ``--augment-shift K`` trains on the same minibatches (the same rows in the same
order, the same Monte Carlo noise) with each image moved by a random whole-pixel shift of up to K
pixels in each direction, drawn per image and step from the seed (:func:`shifted_batches`); the
shift is part of the cell's key and of its checkpoint folder, so a run with and one without it are
a like-for-like comparison.

Inputs are standardised with the training images' mean and standard deviation (one number each).
"""

from __future__ import annotations

if not __package__:  # run by path: load benchmarks/ as the package (benchmarks/_by_path.py)
    import _by_path  # noqa: F401  (imported for its side effect)

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

import deepgp_gi as dg
from benchmarks import mnist_summary
from benchmarks.common import (
    add_drop_lost_trace_option,
    append_line,
    code_commit,
    mean_se,
    portable,
    read_lines,
    trace_to_checkpoint,
)
from deepgp_gi import metrics

POSTERIORS = ("factorised", "global", "factorised_global")
#: Ritter et al.'s inducing-weight families on the same conv nets (``--num-inducing`` is M).
INDUCING_WEIGHTS = ("ffg_u", "ensemble_u", "ensemble_w")
PRIORS = ("neal", "spatial_iw")


def load(dataset: str, path, split: int):
    if dataset == "digits":
        return dg.datasets.load_digits(split)
    if dataset == "mnist":
        return dg.datasets.load_mnist(path)  # path None: the arrays tools/fetch_mnist.py wrote
    if dataset == "cifar10":
        return dg.datasets.load_cifar10(path)
    raise ValueError(f"unknown dataset {dataset!r}")


def evaluate(model, X, Y, num_samples: int, seed: int | None = None, chunk: int = 500) -> dict:
    probs = metrics.predict_class_probabilities(model, X, num_samples, chunk_size=chunk, seed=seed)
    # log p(y | x) = log mean_s softmax(f_s)[y], the label's entry of the same predictive
    # probabilities (predict_log_density's estimator, without a second pass over the test images)
    labels = np.asarray(Y[:, 0], dtype=np.int64)
    lpd = np.log(np.maximum(probs[np.arange(len(labels)), labels], np.finfo(np.float64).tiny))
    return {
        "accuracy": metrics.top1_accuracy(probs, Y),
        "test_ll": float(np.mean(lpd)),
        "ece": metrics.expected_calibration_error(probs, Y, num_bins=15),
        "entropy": float(np.mean(metrics.categorical_entropy(probs))),
    }


def elbo_per_image(model, X, Y, num_samples: int, chunk: int = 500) -> float:
    """The full-data ELBO / N: the expected log-likelihood summed over chunks (each chunk's
    ``elbo_terms`` is rescaled to the full data, so it is weighted by its share) minus the KL,
    averaged over ``num_samples`` samples per chunk. ``X`` may be the first rows of the training
    set only (``--elbo-rows``): the rescaled expected log-likelihood is then an estimate of the
    full-data sum from those rows."""
    N = len(X)
    ell, kls = 0.0, []
    for i in range(0, N, chunk):
        e, k = model.elbo_terms((X[i : i + chunk], Y[i : i + chunk]), num_samples, seed=i)
        ell += float(np.mean(e.numpy())) * len(X[i : i + chunk]) / N
        kls.append(float(np.mean(k.numpy())))
    return (ell - float(np.mean(kls))) / (model.num_data or N)


def _m(posterior: str, num_inducing: int):
    """M where it changes the model (global inducing images, inducing-weight size), else None."""
    return None if posterior in ("factorised", "ensemble_w", "local") else num_inducing


#: The random stream of the image shifts (:func:`shifted_batches`), apart from fit's batch (1)
#: and noise (2) streams.
SHIFT_STREAM = 3


def shift_images(images, shifts, max_shift: int, fill):
    """Each image moved by its own whole-pixel shift, the uncovered border set to ``fill``.

    :param images: ``[B, H, W, C]``.
    :param shifts: ``[B, 2]`` integers ``(down, right)``, each in ``[-max_shift, max_shift]``.
    :param max_shift: the largest shift in pixels (the padding).
    :param fill: the value of the border a shift uncovers (the background).
    :returns: ``[B, H, W, C]``: ``out[b, r, c] = images[b, r - down_b, c - right_b]`` where that
        pixel exists, else ``fill``.
    """
    import tensorflow as tf

    k = int(max_shift)
    H, W = int(images.shape[1]), int(images.shape[2])
    padded = tf.pad(images, [[0, 0], [k, k], [k, k], [0, 0]], constant_values=fill)
    shifts = tf.cast(shifts, tf.int32)
    rows = tf.range(H)[None, :] - shifts[:, :1] + k  # [B, H] rows of the padded image
    cols = tf.range(W)[None, :] - shifts[:, 1:] + k  # [B, W]
    moved = tf.gather(padded, rows, axis=1, batch_dims=1)  # [B, H, W + 2k, C]
    return tf.gather(moved, cols, axis=2, batch_dims=1)


def shifted_batches(X, Y, batch_size: int, seed: int, max_shift: int):
    """The minibatches ``fit(model, (X, Y), batch_size=..., seed=seed)`` trains on (the same rows
    in the same order, :func:`deepgp_gi.training.batches.batch_indices`), each image moved by a
    random shift of up to ``max_shift`` pixels in each direction, drawn per image and step from a
    stateless stream of ``seed``; the border is filled with the smallest training pixel (the
    background). An endless ``tf.data.Dataset`` of ``(X_b, Y_b)`` for ``fit`` (with
    ``model.num_data = len(X)``); a resumed fit skips the batches used, so it sees what an
    uninterrupted run would."""
    import tensorflow as tf

    from deepgp_gi.training.batches import batch_indices

    if int(max_shift) < 1:
        raise ValueError(f"max_shift must be a positive number of pixels, got {max_shift}")
    X, Y = tf.constant(X), tf.constant(Y)
    N, fill = int(X.shape[0]), tf.reduce_min(X)
    stream = tf.constant([seed, SHIFT_STREAM], tf.int64)

    def take(step):
        idx = batch_indices(step, N, batch_size, seed)
        step_seed = tf.random.experimental.stateless_fold_in(stream, step)
        shifts = tf.random.stateless_uniform(
            [tf.size(idx), 2], step_seed, minval=-max_shift, maxval=max_shift + 1, dtype=tf.int32
        )
        return shift_images(tf.gather(X, idx), shifts, max_shift, fill), tf.gather(Y, idx)

    return tf.data.Dataset.range(2**62).map(take)


def _options_text(options) -> str:
    """Canonical text of a cell's posterior options ("" for the builder's defaults)."""
    return json.dumps(options, sort_keys=True) if options else ""


def parse_lr_decay(text: str | None) -> list | None:
    """``--lr-decay RATE,EVERY`` as ``[rate, every]`` (``None`` for none): the learning rate is
    multiplied by ``rate`` every ``every`` steps (a staircase)."""
    if not text:
        return None
    try:
        rate_text, every_text = text.split(",")
        rate, every = float(rate_text), int(every_text)
    except ValueError:
        raise ValueError(f"--lr-decay takes RATE,EVERY (e.g. 0.5,1200), got {text!r}") from None
    if not (0 < rate <= 1 and every >= 1):
        raise ValueError(f"--lr-decay: RATE must be in (0, 1] and EVERY positive, got {text!r}")
    return [rate, every]


def parse_widths(text: str | None, name: str) -> list | None:
    """``--channels``/``--hidden`` as a list of positive widths (``None`` when not given: the
    builder's defaults)."""
    if text is None:
        return None
    try:
        widths = [int(w) for w in text.split(",")] if text.strip() else []
    except ValueError:
        raise ValueError(
            f"{name} takes comma-separated widths (e.g. 20,50), got {text!r}"
        ) from None
    if any(w < 1 for w in widths):
        raise ValueError(f"{name}: every width must be positive, got {text!r}")
    return widths


def net_name(row: dict) -> str:
    """A row's network: its architecture, followed by its layer widths where they are not the
    builder's defaults (``lenet c20-50 h500``: conv widths 20 and 50, one dense hidden layer of
    500)."""
    text = row["architecture"]
    if row.get("channels") is not None:
        text += " c" + "-".join(map(str, row["channels"]))
    if row.get("hidden") is not None:
        text += " h" + ("-".join(map(str, row["hidden"])) or "none")
    return text


def _widths(args) -> dict:
    """The layer widths given on the command line (``channels``/``hidden``; none: the builder's
    defaults), as ``build_conv_bnn`` takes them and a row records them."""
    return {k: getattr(args, k) for k in ("channels", "hidden") if getattr(args, k) is not None}


def _widths_tag(args) -> str:
    """The checkpoint folder's suffix of ``--channels``/``--hidden`` (``-c20-50-h500``): the
    widths of :func:`net_name`."""
    return net_name(vars(args))[len(args.architecture) :].replace(" ", "-")


def _decay(row: dict) -> tuple | None:
    """A row's learning-rate decay as ``(rate, every)``; ``None`` for none (rows written before the
    option existed have no such field and read as no decay)."""
    decay = row.get("lr_decay")
    return None if not decay else (float(decay[0]), int(decay[1]))


def _decay_text(decay) -> str:
    return f"lr x{decay[0]:g} every {decay[1]:,} steps"


def cell_key(row: dict) -> tuple:
    return (
        row["dataset"],
        net_name(row),
        row["posterior"],
        row["prior"],
        row["seed"],
        row["steps"],
        _m(row["posterior"], row["num_inducing"]),
        _options_text(row.get("posterior_options")),
        row.get("augment_shift", 0),
        _decay(row),
    )


def run_key(line: dict) -> tuple:
    """A training run of a trace line (or a row): everything that changes its trajectory, not the
    number of steps, except under the ``linear`` KL schedule, whose ramp is 10% of the steps."""
    return (
        line["dataset"],
        line.get("split", 0),
        net_name(line),
        line["posterior"],
        line["prior"],
        line["seed"],
        _m(line["posterior"], line["num_inducing"]),
        _options_text(line.get("posterior_options")),
        line["batch_size"],
        float(line["lr"]),
        _decay(line),
        line["kl_schedule"],
        line["steps"] if line["kl_schedule"] == "linear" else None,
        line.get("train_samples", 1),
        line.get("augment_shift", 0),
    )


def default_trace(out: str) -> str:
    """The trace file beside the results file ``out``: ``x.jsonl`` -> ``x_trace.jsonl``."""
    return (out[: -len(".jsonl")] if out.endswith(".jsonl") else out) + "_trace.jsonl"


def _checkpoint_folder(args, posterior: str, prior: str, seed: int) -> Path | None:
    """The cell's checkpoint folder under ``--checkpoint-dir`` (``None`` without one). A run
    trained in one piece names its steps; a run in segments (``--eval-every``) names what changes
    its trajectory instead (:func:`run_key`), so a later sweep with more steps continues it."""
    if not args.checkpoint_dir:
        return None
    tag = "-".join(f"{k}{v}" for k, v in sorted(args.options.items()))
    decay = f"-decay{args.lr_decay[0]:g}x{args.lr_decay[1]}" if args.lr_decay else ""
    if not args.eval_every:
        name = f"{args.dataset}-{args.architecture}{_widths_tag(args)}-{posterior}-{prior}-{seed}"
        name += f"-{args.steps}" + decay
        name += f"-shift{args.augment_shift}" if args.augment_shift else ""
    else:
        m = _m(posterior, args.num_inducing)
        kl = args.kl_schedule + (str(args.steps) if args.kl_schedule == "linear" else "")
        name = (
            f"{args.dataset}"
            + (f"-split{args.split}" if args.split else "")
            + f"-{args.architecture}{_widths_tag(args)}-{posterior}-{prior}-{seed}"
            + (f"-M{m}" if m is not None else "")
            + f"-b{args.batch_size}-lr{args.lr:g}{decay}-kl{kl}-s{args.train_samples}"
            + (f"-shift{args.augment_shift}" if args.augment_shift else "")
            + "-segments"
        )
    return Path(args.checkpoint_dir) / (name + (f"-{tag}" if tag else ""))


def _segment_ms(history, start: int, seconds: float, steps: int) -> float:
    """ms/step of the segment after ``start``: steady state between its first and last logged
    steps (tracing excluded; :func:`benchmarks.mnist_dgp.segment_ms_per_step`), else its wall
    time over its steps."""
    from benchmarks.mnist_dgp import segment_ms_per_step

    ms = segment_ms_per_step(history, start)
    return ms if ms is not None else 1000.0 * seconds / max(1, steps)


def _train_in_segments(args, model, train, N: int, test, base: dict, fit_args: dict) -> tuple:
    """Train ``model`` to ``args.steps`` in segments of ``args.eval_every`` steps, each resuming
    from the checkpoint the one before left, and after each segment append a trace line (test
    accuracy, test LL, ECE and entropy with ``--trace-samples`` samples, the segment's ms/step).
    A run interrupted earlier resumes at its checkpoint and continues its trace (the steps already
    traced are not traced again). Returns ``(ms/step, training seconds)`` of the whole run: the
    median over its segments and the sum over every invocation that trained it."""
    from benchmarks.mnist_dgp import checkpoint_step

    Xte, Yte = test
    folder, every, seed = fit_args["checkpoint_dir"], args.eval_every, base["seed"]
    done = checkpoint_step(folder)
    if done > args.steps:
        raise SystemExit(
            f"{portable(str(folder))} holds a run at step {done}, past --steps {args.steps}: use "
            "another --checkpoint-dir (or more steps)"
        )
    key = run_key(base)
    mine = trace_to_checkpoint(args.trace, run_key, key, done, args.drop_lost_trace)
    traced = {t["step"] for t in mine}
    seconds = max((t["train_seconds"] for t in mine), default=0.0)

    def record(step: int, ms: float | None) -> None:
        line = dict(
            base,
            steps=args.steps,
            step=step,
            epoch=step * base["batch_size"] / N,
            test_samples=args.trace_samples,
            **evaluate(model, Xte, Yte, args.trace_samples, seed=seed),
            segment_ms_per_step=ms,
            train_seconds=seconds,
        )
        append_line(args.trace, line)
        traced.add(step)

    if done:  # restore the checkpoint (fit returns at once: nothing is left to train up to it)
        dg.fit(model, train, steps=done, progress=False, **fit_args)
        if done not in traced and (done % every == 0 or done == args.steps):
            record(done, None)  # killed between its checkpoint and its trace line
    while done < args.steps:
        target = min(args.steps, (done // every + 1) * every)
        start = time.perf_counter()
        history = dg.fit(model, train, steps=target, progress=True, **fit_args)
        elapsed = time.perf_counter() - start
        seconds += elapsed
        ms = _segment_ms(history, done, elapsed, target - done)
        done = target
        record(done, ms)
    segments = [
        t["segment_ms_per_step"]
        for t in read_lines(args.trace)
        if run_key(t) == key and 0 < t["step"] <= args.steps and t.get("segment_ms_per_step")
    ]
    return (float(np.median(segments)) if segments else float("nan")), seconds


def _cell_setup(args, data, posterior: str, prior: str, seed: int) -> tuple:
    """What a cell trains: ``(model, train, (X_train, Y_train), (X_test, Y_test), base,
    fit_args)``: the model as built, what ``fit`` trains on (the arrays, or the shifted batches of
    ``--augment-shift``), the standardised training and test arrays, the row's settings and
    ``fit``'s arguments (with ``--eval-every``, those of a run in segments)."""
    from deepgp_gi.training.tempering import resolve_kl_schedule
    from deepgp_gi.uci_protocol import learning_rate_of

    Xtr, Xte = dg.datasets.standardise_images(data.X_train, data.X_test)
    Ytr, Yte = data.Y_train, data.Y_test
    model = dg.build_conv_bnn(
        Xtr,
        Ytr,
        architecture=args.architecture,
        posterior=posterior,
        prior=prior,
        num_inducing=args.num_inducing,
        seed=seed,
        **_widths(args),
        **args.options,
    )
    base = {
        "dataset": args.dataset,
        "architecture": args.architecture,
        "posterior": posterior,
        "prior": prior,
        "seed": seed,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "num_inducing": args.num_inducing,
        "lr": args.lr,
        "lr_decay": args.lr_decay,
        "kl_schedule": args.kl_schedule,
        "train_samples": args.train_samples,
        "posterior_options": args.options,
    }
    if args.augment_shift:
        base["augment_shift"] = args.augment_shift
    base.update(_widths(args))
    kl_schedule = None if args.kl_schedule == "none" else args.kl_schedule
    if args.eval_every and kl_schedule == "linear":  # the whole run's ramp, not a segment's
        kl_schedule = resolve_kl_schedule("linear", steps=args.steps, steps_per_epoch=None)
    fit_args = dict(
        batch_size=min(args.batch_size, len(Xtr)),
        learning_rate=learning_rate_of(
            {"learning_rate": args.lr, "learning_rate_decay": args.lr_decay}
        ),
        num_samples=args.train_samples,
        seed=seed,
        checkpoint_dir=_checkpoint_folder(args, posterior, prior, seed),
    )
    if kl_schedule is not None:
        fit_args["kl_schedule"] = kl_schedule
    train = (Xtr, Ytr)
    if args.augment_shift:  # the same minibatches, each image shifted (a dataset: fit's batch_size
        # is its own)
        train = shifted_batches(Xtr, Ytr, fit_args.pop("batch_size"), seed, args.augment_shift)
    if args.eval_every:
        fit_args.update(checkpoint_every=args.eval_every, log_every=max(1, args.eval_every // 10))
    return model, train, (Xtr, Ytr), (Xte, Yte), base, fit_args


def run_cell(args, data, posterior: str, prior: str, seed: int) -> dict:
    model, train, (Xtr, Ytr), (Xte, Yte), base, fit_args = _cell_setup(
        args, data, posterior, prior, seed
    )
    start = time.perf_counter()
    if args.eval_every:
        trace_base = dict(base, split=args.split, benchmark="images")
        ms_per_step, train_seconds = _train_in_segments(
            args, model, train, len(Xtr), (Xte, Yte), trace_base, fit_args
        )
    else:
        history = dg.fit(
            model,
            train,
            steps=args.steps,
            log_every=max(1, args.steps // 20),
            progress=True,
            **fit_args,
        )
        train_seconds = time.perf_counter() - start
        steps_run = args.steps - history.resumed_from
        # steady state: between the first and last logged steps (tracing and start-up excluded)
        ms_per_step = (
            1000.0
            * (history.wall_time[-1] - history.wall_time[0])
            / (history.step[-1] - history.step[0])
            if len(history.step) > 1
            else 1000.0 * train_seconds / max(1, steps_run)
        )
    row = dict(base)
    row.update(
        {
            "test_samples": args.test_samples,
            "ms_per_step": ms_per_step,
            "train_seconds": train_seconds,
            "elbo_per_image": elbo_per_image(
                model,
                Xtr[: args.elbo_rows or None],
                Ytr[: args.elbo_rows or None],
                args.test_samples,
            ),
            "elbo_rows": min(args.elbo_rows or len(Xtr), len(Xtr)),
            "parameters": dg.parameter_count(model),
        }
    )
    if args.eval_every:
        row.update(eval_every=args.eval_every, trace_samples=args.trace_samples, trace=args.trace)
    row.update(evaluate(model, Xte, Yte, args.test_samples))
    # the home folder as ~, so the recorded command reads the same on any machine
    row["command"] = " ".join([os.path.basename(sys.executable)] + sys.argv).replace(
        os.path.expanduser("~"), "~"
    )
    return row


def evaluate_cells(args) -> list:
    """Score finished cells again: each (posterior, prior, seed) cell of the arguments, restored
    from its checkpoint at ``--steps`` (a cell not trained that far is an error), evaluated on the
    test images with each of ``--samples`` Monte Carlo samples and the seed ``--eval-seed``; one
    line per (cell, samples) appended to ``--eval-out`` (the cell's settings, ``samples``,
    ``eval_seed``, accuracy, test LL, ECE and entropy). The question it answers: how much of a
    cell's score is the Monte Carlo noise of its evaluation."""
    from benchmarks.mnist_dgp import checkpoint_step

    args.options = _parse_options(args.posterior_options)
    data = load(args.dataset, args.path, args.split)
    lines = []
    for seed in map(int, args.seeds.split(",")):
        for prior in args.priors.split(","):
            for posterior in args.posteriors.split(","):
                model, train, _, (Xte, Yte), base, fit_args = _cell_setup(
                    args, data, posterior, prior, seed
                )
                folder = fit_args.get("checkpoint_dir")
                done = checkpoint_step(folder) if folder else 0
                if done != args.steps:
                    raise SystemExit(
                        f"{posterior} {prior} seed {seed}: its checkpoint is at step {done}, not "
                        f"--steps {args.steps} (evaluate scores finished cells)"
                    )
                dg.fit(model, train, steps=done, progress=False, **fit_args)  # restores
                for samples in map(int, args.samples.split(",")):
                    line = dict(
                        base,
                        samples=samples,
                        eval_seed=args.eval_seed,
                        **evaluate(
                            model, Xte, Yte, samples, args.eval_seed, max(10, 5000 // samples)
                        ),
                        commit=code_commit(),
                        command=" ".join(["python"] + sys.argv),
                    )
                    append_line(args.eval_out, line)
                    print(json.dumps(line), flush=True)
                    lines.append(line)
    return lines


def _parse_options(text):
    try:
        options = json.loads(text) if text else {}
    except json.JSONDecodeError as err:
        raise SystemExit(f"--posterior-options is not a JSON object: {err}") from None
    if not isinstance(options, dict):
        raise SystemExit("--posterior-options must be a JSON object, e.g. '{\"lambda_max\": 0.03}'")
    return options


def sweep(args):
    if args.paper:
        args.architecture, args.num_inducing, args.batch_size, args.lr = "resnet", 500, 500, 1e-2
        args.train_samples, args.test_samples, args.kl_schedule = 1, 10, "paper"
    args.options = _parse_options(args.posterior_options)
    if args.eval_every and not args.trace:
        args.trace = default_trace(args.out)
    data = load(args.dataset, args.path, args.split)
    done = {cell_key(row) for row in read_lines(args.out)}
    for seed in map(int, args.seeds.split(",")):
        for prior in args.priors.split(","):
            for posterior in args.posteriors.split(","):
                key = cell_key(
                    {
                        "dataset": args.dataset,
                        "architecture": args.architecture,
                        "posterior": posterior,
                        "prior": prior,
                        "seed": seed,
                        "steps": args.steps,
                        "num_inducing": args.num_inducing,
                        "posterior_options": args.options,
                        "lr_decay": args.lr_decay,
                        "augment_shift": args.augment_shift,
                        "channels": args.channels,
                        "hidden": args.hidden,
                    }
                )
                if key in done:
                    continue
                print(
                    f"== {args.dataset} {net_name(vars(args))} {posterior} {prior} seed {seed}",
                    flush=True,
                )
                row = run_cell(args, data, posterior, prior, seed)
                append_line(args.out, row)
                print(json.dumps(row), flush=True)


#: Published LeNet-5 numbers on MNIST (60,000 / 10,000), printed under a report of MNIST rows.
PUBLISHED_MNIST = (
    "LeCun, Bottou, Bengio & Haffner (1998), *Gradient-based learning applied to document "
    "recognition*, Proc. IEEE 86(11), Section III: LeNet-5 (a point estimate, tanh units, trained "
    "20 passes with a stochastic diagonal Levenberg-Marquardt method) has a test error of 0.95% "
    "(accuracy 99.05%), 0.8% (99.2%) when trained on the images plus distorted copies. The paper "
    "reports no test log-likelihood or calibration.",
)


def _settings_lines(rows) -> list:
    """One line per distinct training setting (batch, learning rate, KL schedule, test samples)."""
    seen = sorted(
        {
            (
                r["dataset"],
                r["steps"],
                r["batch_size"],
                r["lr"],
                r["kl_schedule"],
                r["test_samples"],
                r.get("elbo_rows") or 0,
                _decay(r) or (),
            )
            for r in rows
        }
    )
    return [
        f"* {d}: {st:,} steps of batch {b} (Adam, learning rate {lr:g}"
        + (f" times {dec[0]:g} every {dec[1]:,} steps" if dec else "")
        + f"), KL schedule `{kl}`, {ts} test samples"
        + (f", ELBO estimated on the first {n:,} training images" if n else "")
        for d, st, b, lr, kl, ts, n, dec in seen
    ]


def _groups(rows) -> dict:
    """The rows by table row: ``(dataset, net, steps, prior, posterior label)`` -> rows."""
    groups = {}
    for r in rows:
        label = r["posterior"]
        if r["posterior"] in INDUCING_WEIGHTS and _m(r["posterior"], r["num_inducing"]) is not None:
            label += f" M={r['num_inducing']}"
        if r.get("posterior_options"):
            label += " " + ", ".join(f"{k}={v}" for k, v in sorted(r["posterior_options"].items()))
        if _decay(r):
            label += f" ({_decay_text(_decay(r))})"
        if r.get("augment_shift"):
            label += f" (shifts ≤{r['augment_shift']} px)"
        groups.setdefault((r["dataset"], net_name(r), r["steps"], r["prior"], label), []).append(r)
    return groups


def render_report(
    rows,
    results: str,
    out: str | None = None,
    plot_path: str | None = None,
    trace_path: str | None = None,
) -> str:
    """The report (markdown) of the result lines ``rows`` read from ``results``; ``out`` and
    ``plot_path`` are where it and the plot go, named in its command line; ``trace_path``: the
    trace file the plot is drawn from (None: the plot is of the rows, against training time)."""
    groups = _groups(rows)
    lines = [
        "# Convolutional BNNs on images",
        "",
        "Mean ± standard error over seeds (n = number of seeds). Accuracy and ECE in %, test "
        "log-likelihood and ELBO per image in nats; ms/step on the machine that ran the cell "
        "(compare only within one file).",
        "",
        f"Produced by `python benchmarks/images.py report --results {results} --out {out}"
        + (f" --plot {plot_path}" if plot_path else "")
        + (f" --trace {trace_path}" if trace_path else "")
        + "`; "
        "each row's sweep command is in the JSON lines.",
        "",
    ]
    commands = sorted({r["command"] for r in rows if "command" in r})
    if len(commands) <= 3:
        lines += ["Sweep command(s):", ""] + [f"    {c}" for c in commands] + [""]
    lines += ["Settings:", ""] + _settings_lines(rows) + [""]
    lines += [
        "| dataset | net | steps | prior | posterior | n | accuracy | test LL | ECE | entropy | "
        "ELBO/N | ms/step | params |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = {p: i for i, p in enumerate(POSTERIORS + INDUCING_WEIGHTS)}
    for key in sorted(
        groups, key=lambda k: (k[0], k[1], k[2], k[3], order.get(k[4].split()[0], 9), k[4])
    ):
        g = groups[key]

        def cell(name, scale=1.0, digits=3):
            m, s, _ = mean_se(r[name] * scale for r in g)
            return f"{m:.{digits}f}" + ("" if math.isnan(s) else f" ± {s:.{digits}f}")

        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {key[4]} | {len(g)} | "
            f"{cell('accuracy', 100, 1)} | {cell('test_ll')} | {cell('ece', 100, 1)} | "
            f"{cell('entropy')} | {cell('elbo_per_image')} | {cell('ms_per_step', 1, 0)} | "
            + (f"{g[0]['parameters']:,}" if "parameters" in g[0] else "")
            + " |"
        )
    if any(r["dataset"] == "mnist" for r in rows):
        lines += ["", "Published LeNet numbers on MNIST:", ""] + [f"* {p}" for p in PUBLISHED_MNIST]
        summary = mnist_summary.summary_table(os.path.dirname(os.path.abspath(results)))
        if summary:
            lines += [
                "",
                "## MNIST against the published numbers",
                "",
                "The DSVI deep-GP cells (`mnist_dgp.jsonl`) and the 30-epoch LeNet runs "
                "(`mnist_long.jsonl`) beside this file (`python benchmarks/mnist_summary.py` "
                "writes a short form into the README):",
                "",
            ] + summary[:-1]
            lines += _trace_figures(os.path.dirname(os.path.abspath(results)), plot_path)
    if plot_path and trace_path:
        lines += [
            "",
            f"The figure is drawn from the runs' traces (`{trace_path}`: test accuracy, "
            "log-likelihood and ECE after every segment of `--eval-every` steps, with the "
            "trace's Monte Carlo samples): the mean over seeds as a line, the lowest to the "
            "highest seed as a band.",
            "",
            "![accuracy, test log-likelihood and ECE against epochs, from each run's "
            f"trace]({os.path.basename(plot_path)})",
        ]
    elif plot_path:
        lines += [
            "",
            "Against training time, each point a finished row: a line joins rows of one "
            "configuration trained for different numbers of steps, separate runs on a machine "
            "whose load differed between them.",
            "",
            "![accuracy, test log-likelihood and ECE against training "
            f"time]({os.path.basename(plot_path)})",
        ]
    return "\n".join(lines) + "\n"


#: The figures drawn from the MNIST runs' own traces, by file name: what each shows.
MNIST_TRACE_FIGURES = {
    "mnist_long.png": "the 30-epoch LeNet runs against epochs (`mnist_long.md`)",
    "mnist_dgp.png": "the DSVI deep-GP cells against steps (`mnist_dgp.md`)",
}


def _trace_figures(folder: str, plot_path: str | None) -> list:
    """Markdown lines linking the MNIST figures drawn from each run's own trace
    (:data:`MNIST_TRACE_FIGURES`) that exist in ``folder``, other than the report's own plot."""
    own = os.path.basename(plot_path) if plot_path else None
    found = [
        (name, what)
        for name, what in MNIST_TRACE_FIGURES.items()
        if name != own and os.path.exists(os.path.join(folder, name))
    ]
    if not found:
        return []
    lines = [
        "",
        "Drawn from each run's own trace (the mean over seeds as a line, the lowest to the "
        "highest seed as a band, the published numbers as reference lines):",
    ]
    for name, what in found:
        lines += ["", f"![{what}]({name})"]
    return lines


def report(args):
    rows = read_lines(args.results)
    trace_path = args.trace or default_trace(args.results)
    if args.trace and not os.path.exists(args.trace):
        raise SystemExit(f"--trace {args.trace}: no such file")
    trace = [t for t in read_lines(trace_path) if t.get("benchmark") == "images"]
    text = render_report(rows, args.results, args.out, args.plot, trace_path if trace else None)
    finished = {run_key(r) for r in rows if r.get("benchmark", "images") == "images"}
    finished_trace = [t for t in trace if run_key(t) in finished]  # not a running run's part
    if args.plot and finished_trace:
        plot_traces(finished_trace, args.plot)
    elif args.plot:
        plot(_groups(rows), args.plot)
    if args.out:
        Path(args.out).write_text(text)
    print(text)


def plot(groups: dict, path: str) -> None:
    """Accuracy, test log-likelihood and ECE against training time (seconds, mean over seeds), one
    line per (dataset, net, prior, posterior) through its step budgets: the posterior's family
    colour, a line style per prior, each point labelled with its step budget (first panel)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks import plot_style

    lines = {}
    for (dataset, net, steps, prior, label), g in groups.items():
        if any("train_seconds" not in r for r in g):
            continue
        point = (
            np.mean([r["train_seconds"] for r in g]),
            np.mean([r["accuracy"] for r in g]) * 100,
            np.mean([r["test_ll"] for r in g]),
            np.mean([r["ece"] for r in g]) * 100,
            steps,
        )
        lines.setdefault((dataset, net, prior, label), []).append(point)
    priors = sorted({key[2] for key in lines})
    linestyles = {pr: plot_style.variant_linestyle(i) for i, pr in enumerate(priors)}
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    tags = []
    for (dataset, net, prior, label), points in sorted(lines.items()):
        points.sort()
        t = [p[0] for p in points]
        name = f"{label}, {prior} prior" + (
            "" if len({k[0] for k in lines}) == 1 else f" ({dataset} {net})"
        )
        for ax, k in zip(axes, (1, 2, 3)):
            ax.plot(
                t,
                [p[k] for p in points],
                marker="o",
                ms=5,
                ls=linestyles[prior],
                color=plot_style.family_colour(label, "bnn"),
                label=name,
            )
        tags += [(tx, p[1], f"{p[4]:,}") for tx, p in zip(t, points)]
    units = ("test accuracy (%)", "test log-likelihood (nats per image)", "ECE (%)")
    for ax, name in zip(axes, units):
        ax.set_title(name, fontsize=10)
        ax.set_ylabel(name)
        ax.set_xlabel("training time (s)")
        ax.grid(alpha=0.3)
        ax.margins(0.08)
    fig.suptitle(
        "labels in the first panel: training steps; colour: the posterior family, line style: the "
        "prior; training times from the machine that ran each row (its load differed between rows)",
        fontsize=9,
    )
    fig.tight_layout()
    plot_style.legend_outside(fig, where="below", ncol=3, fontsize=9)
    plot_style.place_labels(axes[0], tags, fontsize=7)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


#: LeNet-5's published MNIST test accuracy (%), the reference line of the trace figure.
LENET5_MNIST_ACCURACY = mnist_summary.LENET5_ACCURACY


def _settings_text(key: tuple) -> str:
    """The training settings of a run key (:func:`run_key`) as a legend names them."""
    (_, _, _, _, _, _, _, _, batch, lr, decay, kl, kl_steps, _, shift) = key
    text = f"batch {batch}, lr {lr:g}" + (f", {_decay_text(decay)}" if decay else "")
    text += f", KL {kl}" + (f" over {kl_steps:,} steps" if kl_steps else "")
    return text + (f", shifts ≤{shift} px" if shift else "")


def trace_runs(trace) -> dict:
    """The trace lines by run (:func:`run_key`) and step: ``run key -> {step: line}`` (a step
    traced twice keeps its last line)."""
    runs = {}
    for t in trace:
        runs.setdefault(run_key(t), {})[t["step"]] = t
    return runs


def plot_traces(trace, path: str) -> None:
    """Accuracy (%), test log-likelihood and ECE (%) against epochs, drawn from each run's own
    trace: one line per configuration (a run key without its seed) through the mean over its
    seeds at each traced epoch, a band from the lowest to the highest seed; the posterior family's
    colour, a line style per prior, network, settings and family options (the legend names the
    network and the settings when the trace holds several); LeNet-5's published 99.05% on MNIST as
    a black dashed line in the accuracy panel (named in the legend). Each panel's y axis spans the
    values of the last two thirds of the epochs (and the reference line), so that the trained
    models' differences show; earlier points may fall outside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks import plot_style

    configs = {}  # run key without its seed -> {seed: {epoch: line}}
    for key, points in trace_runs(trace).items():
        seed = key[5]
        config = key[:5] + key[6:]
        configs.setdefault(config, {})[seed] = {t["epoch"]: t for t in points.values()}
    variants = sorted(
        {(c[4], _settings_text(c[:5] + (None,) + c[5:]), c[2], c[6] or "") for c in configs},
        key=lambda v: (PRIORS.index(v[0]) if v[0] in PRIORS else len(PRIORS), v),
    )
    styles = {v: plot_style.variant_linestyle(i) for i, v in enumerate(variants)}
    several = len({v[1] for v in variants}) > 1
    datasets = {c[0] for c in configs}
    nets = {c[2] for c in configs}
    order = {p: i for i, p in enumerate(POSTERIORS + INDUCING_WEIGHTS)}
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    panels = (("accuracy", 100.0), ("test_ll", 1.0), ("ece", 100.0))
    last_epoch = max(
        (e for seeds in configs.values() for p in seeds.values() for e in p), default=0
    )
    late = [[] for _ in panels]  # the values of the last two thirds of training, per panel
    for config in sorted(configs, key=lambda c: (c[0], c[2], order.get(c[3], 99), c[3], c[4])):
        dataset, split, net, posterior, prior = config[:5]
        seeds = configs[config]
        settings = _settings_text(config[:5] + (None,) + config[5:])
        epochs = sorted({e for points in seeds.values() for e in points})
        label = posterior
        m = config[5]
        if posterior in INDUCING_WEIGHTS and m is not None:
            label += f" M={m}"
        if config[6]:
            label += " " + ", ".join(f"{k}={v}" for k, v in sorted(json.loads(config[6]).items()))
        name = (
            f"{label}, {prior} prior"
            + ("" if len(datasets) == 1 else f" ({dataset} {net})")
            + ("" if len(datasets) > 1 or len(nets) == 1 else f" ({net})")
            + (f", {settings}" if several else "")
            + f" ({len(seeds)} seed{'s' if len(seeds) > 1 else ''})"
        )
        colour = plot_style.family_colour(posterior, "bnn")
        for ax, (field, scale), kept in zip(axes, panels, late):
            values = [
                [scale * points[e][field] for points in seeds.values() if e in points]
                for e in epochs
            ]
            kept += [x for e, v in zip(epochs, values) if e >= last_epoch / 3 for x in v]
            ax.plot(
                epochs,
                [np.mean(v) for v in values],
                color=colour,
                ls=styles[(prior, settings, net, config[6] or "")],
                marker="o",
                ms=3,
                label=name,
            )
            if len(seeds) > 1:
                ax.fill_between(
                    epochs,
                    [min(v) for v in values],
                    [max(v) for v in values],
                    color=colour,
                    alpha=0.2,
                    lw=0,
                )
    if "mnist" in datasets:
        axes[0].axhline(
            LENET5_MNIST_ACCURACY,
            color=plot_style.REFERENCE_COLOUR,
            ls="--",
            lw=1,
            label=f"LeNet-5, LeCun et al. (1998): {LENET5_MNIST_ACCURACY}%",
        )
        late[0].append(LENET5_MNIST_ACCURACY)
    for ax, values in zip(axes, late):  # the scale of the trained models, not of the first epochs
        if values:
            low, high = min(values), max(values)
            pad = 0.08 * (high - low) if high > low else 0.05 * max(abs(high), 1e-3)
            ax.set_ylim(low - pad, high + pad)
    units = ("test accuracy (%)", "test log-likelihood (nats per image)", "ECE (%)")
    for ax, title in zip(axes, units):
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(title)
        ax.set_xlabel("epochs")
        ax.grid(alpha=0.3)
    fig.suptitle(
        "each run's own trace: line = mean over seeds, band = lowest to highest seed; colour: the "
        "posterior family, line style: the prior"
        + (", the network" if len(nets) > 1 and len(datasets) == 1 else "")
        + (" and the training settings" if several else "")
        + ";\ny axes at the scale of the last two thirds of training (earlier points may lie "
        "outside them)",
        fontsize=9,
    )
    fig.tight_layout()
    plot_style.legend_outside(fig, where="below", ncol=2, fontsize=9)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _cell_arguments(p) -> None:
    """The options that name a cell and how it trains (``sweep`` and ``evaluate`` share them)."""
    p.add_argument("--dataset", default="digits", choices=("digits", "mnist", "cifar10"))
    p.add_argument(
        "--path",
        default=None,
        help="CIFAR-10's folder; for MNIST a folder of IDX files or an .npz "
        "(default: where tools/fetch_mnist.py put it)",
    )
    p.add_argument("--split", type=int, default=0)
    p.add_argument("--architecture", default="lenet", choices=("lenet", "resnet"))
    p.add_argument("--posteriors", default=",".join(POSTERIORS))
    p.add_argument("--priors", default=",".join(PRIORS))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--num-inducing", type=int, default=100)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--train-samples", type=int, default=1)
    p.add_argument("--test-samples", type=int, default=10)
    p.add_argument("--kl-schedule", default="paper", help="'paper', 'linear' or 'none'")
    p.add_argument(
        "--posterior-options",
        default=None,
        help='JSON object of build_conv_bnn posterior options, e.g. \'{"lambda_max": 0.03, '
        '"sd_max": 0.1}\' '
        "(part of the cell's key)",
    )
    p.add_argument(
        "--elbo-rows",
        type=int,
        default=None,
        help="estimate the ELBO per image on the first this many training images (default: all)",
    )
    p.add_argument(
        "--paper", action="store_true", help="O&A App. O settings (resnet, M=500, batch 500, ...)"
    )
    p.add_argument(
        "--lr-decay",
        default=None,
        metavar="RATE,EVERY",
        help="multiply Adam's learning rate by RATE every EVERY steps (a staircase; part of the "
        "cell's key); default: a constant learning rate",
    )
    p.add_argument(
        "--eval-every",
        type=int,
        default=None,
        help="train in segments of this many steps (each resuming from the checkpoint of the one "
        "before; needs --checkpoint-dir) and append a trace line after each",
    )
    p.add_argument(
        "--trace",
        default=None,
        help="the trace file of --eval-every (default: --out with _trace before .jsonl)",
    )
    p.add_argument(
        "--trace-samples",
        type=int,
        default=10,
        help="Monte Carlo samples of the trace evaluations",
    )
    p.add_argument(
        "--augment-shift",
        type=int,
        default=0,
        metavar="PIXELS",
        help="train on the same minibatches with each image moved by a random shift of up to this "
        "many pixels in each direction (part of the cell's key); default 0: no augmentation",
    )
    p.add_argument(
        "--channels",
        default=None,
        metavar="C1,C2",
        help="lenet's two convolution widths (part of the cell's key); default: the builder's 6,16",
    )
    p.add_argument(
        "--hidden",
        default=None,
        metavar="H1,...",
        help="lenet's dense hidden widths (part of the cell's key; '' for none); default: the "
        "builder's 120,84",
    )
    p.add_argument("--checkpoint-dir", default=None)
    add_drop_lost_trace_option(p)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sweep")
    _cell_arguments(s)
    s.add_argument("--out", required=True)
    e = sub.add_parser(
        "evaluate", help="score finished cells again with other numbers of test samples"
    )
    _cell_arguments(e)
    e.add_argument("--samples", default="10,50", help="comma-separated Monte Carlo sample counts")
    e.add_argument("--eval-seed", type=int, default=0, help="the evaluation's seed")
    e.add_argument("--eval-out", required=True, help="JSONL file the lines are appended to")
    r = sub.add_parser("report")
    r.add_argument("--results", required=True)
    r.add_argument("--out", default=None)
    r.add_argument(
        "--plot",
        default=None,
        help="also write a PNG of accuracy, test LL and ECE: against epochs from the trace when "
        "there is one, else against training time",
    )
    r.add_argument(
        "--trace",
        default=None,
        help="the trace file to plot (default: the results file's, x_trace.jsonl for x.jsonl, "
        "when it exists)",
    )
    args = parser.parse_args(argv)
    if args.command in ("sweep", "evaluate"):
        try:
            args.channels = parse_widths(args.channels, "--channels")
            args.hidden = parse_widths(args.hidden, "--hidden")
        except ValueError as err:
            parser.error(str(err))
        if args.channels is not None and len(args.channels) != 2:
            parser.error(f"--channels takes lenet's two convolution widths, got {args.channels}")
        if args.architecture != "lenet" and (args.channels, args.hidden) != (None, None):
            parser.error("--channels and --hidden are options of --architecture lenet")
    if args.command == "sweep":
        if args.dataset == "cifar10" and not args.path:
            parser.error("--path is required for cifar10")
        try:
            args.lr_decay = parse_lr_decay(args.lr_decay)
        except ValueError as err:
            parser.error(str(err))
        if args.eval_every is not None:
            if args.eval_every < 1:
                parser.error("--eval-every must be positive")
            if not args.checkpoint_dir:
                parser.error(
                    "--eval-every needs --checkpoint-dir: each segment resumes from the "
                    "checkpoint the one before saved"
                )
        if args.trace_samples < 1:
            parser.error("--trace-samples must be positive")
        sweep(args)
    elif args.command == "evaluate":
        try:
            args.lr_decay = parse_lr_decay(args.lr_decay)
            samples = [int(v) for v in args.samples.split(",")]
        except ValueError as err:
            parser.error(str(err))
        if min(samples) < 1:
            parser.error("--samples must be positive")
        evaluate_cells(args)
    else:
        report(args)


if __name__ == "__main__":
    main()
