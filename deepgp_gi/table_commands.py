"""The ``deepgp-gi`` commands on a user's table: ``fit``, ``predict`` and ``evaluate``.

* ``deepgp-gi fit TABLE --target COL --out DIR`` fits a deep GP to the table's rows (inputs and
  target standardised on the table, so the saved model takes and predicts the table's units) and
  saves it (:func:`deepgp_gi.save`); ``--classes`` fits a classifier (robust-max likelihood; the
  class names are kept in the saved model);
* ``deepgp-gi predict DIR TABLE --out FILE`` writes one row per table row, in order: ``mean``,
  ``sd`` and the central ``--interval`` of the predictive mixture (its quantiles, solved on the
  mixture's CDF by :mod:`deepgp_gi.intervals`), or one probability column per class;
* ``deepgp-gi evaluate DIR TABLE --target COL`` prints a JSON record: the test log-likelihood per
  point (in the table's units), the RMSE (or accuracy and ECE) and the interval's coverage.

Rows are predicted in chunks of :data:`CHUNK_ROWS`; the first chunk uses ``--seed`` as it is
(so a table of at most that many rows gets what ``dg.load(DIR).predict_y(X, S, seed)`` gives),
the others seeds derived from it (:func:`deepgp_gi.metrics.chunk_seed`).

A bad table or argument ends the command with one line on stderr and exit status 2, before
anything is written.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Dict, List, Optional

import numpy as np

__all__ = ["add_table_commands", "add_run_flags", "CHUNK_ROWS", "SAMPLER_SAMPLES", "SAMPLER_THIN"]

#: Rows per prediction call.
CHUNK_ROWS = 1000
#: Samples a sampling family (``--posterior sghmc`` / ``bsgp``) collects after training, and the
#: chain steps between two of them.
SAMPLER_SAMPLES = 100
SAMPLER_THIN = 10


class _CommandError(Exception):
    """An error to print as one line (the command's name first)."""


def _run(command: str, body, args) -> int:
    """Run a command body; a bad table, argument or file ends it with one line on stderr."""
    try:
        return body(args)
    except (ValueError, TypeError, OSError, _CommandError) as err:
        message = " ".join(str(err).split()) or type(err).__name__
        print(f"deepgp-gi {command}: error: {message}", file=sys.stderr)
        return 2


def _features(table, target: str, features: Optional[str]) -> List[str]:
    table.require([target], "--target")
    if features is None:
        names = [n for n in table.names if n != target]
        if not names:
            raise _CommandError(
                f"{table.path}: no columns besides the target {target!r} to use as inputs"
            )
        return names
    names = [n.strip() for n in features.split(",")]
    if any(not n for n in names):
        raise _CommandError(f"--features {features!r} must be comma-separated column names")
    if len(set(names)) != len(names):
        raise _CommandError(f"--features {features!r} names a column twice")
    table.require(names, "--features")
    if target in names:
        raise _CommandError(f"--features names the target column {target!r}")
    return names


# ============================================================================ fit
def _cmd_fit(args) -> int:
    from . import save
    from .tables import ClassLabels, check_writable, read_table
    from .transforms import Standardisation

    out = check_writable(args.out, args.overwrite)
    table = read_table(args.table)
    features = _features(table, args.target, args.features)
    X = table.numeric(features)
    if args.classes:
        labels = ClassLabels.from_cells(table.cells(args.target), args.target, table.path)
        Y = labels.indices(table.cells(args.target), args.target, table.path)
        transform = Standardisation.fit(X)
        Ym = Y
    else:
        labels = None
        Y = table.numeric([args.target])
        transform = Standardisation.fit(X, Y)
        Ym = transform.targets(Y)
    model = _fit_model(args, transform.inputs(X), Ym, None if labels is None else len(labels.names))
    save(
        model,
        out,
        overwrite=args.overwrite,
        transform=transform,
        input_names=features,
        output_names=[args.target],
        class_names=None if labels is None else labels.names,
        serving_samples=args.serving_samples,
    )
    kind = f"{len(labels.names)}-class classifier" if labels else "regression"
    print(
        f"saved a depth-{model.depth} {args.posterior} deep GP ({kind}, {len(features)} inputs, "
        f"{table.num_rows} rows) to {out}"
    )
    return 0


def _fit_model(args, X: np.ndarray, Y: np.ndarray, num_classes: Optional[int]):
    import gpflow

    from .builders import build_deep_gp
    from .training import collect_samples, fit

    N = X.shape[0]
    num_inducing = min(100, N) if args.num_inducing is None else args.num_inducing
    likelihood = None if num_classes is None else gpflow.likelihoods.MultiClass(num_classes)
    model = build_deep_gp(
        X,
        Y,
        depth=args.depth,
        posterior=args.posterior,
        num_inducing=num_inducing,
        likelihood=likelihood,
        seed=args.seed,
    )
    fit(
        model,
        (X, Y),
        steps=args.steps,
        batch_size=args.batch_size,
        learning_rate=args.lr,
        seed=args.seed,
        progress=not args.no_progress,
    )
    if getattr(model.posterior, "is_sampler", False):
        collect_samples(
            model,
            (X, Y),
            num_samples=SAMPLER_SAMPLES,
            thin=SAMPLER_THIN,
            seed=args.seed,
            batch_size=args.batch_size,
            progress=not args.no_progress,
        )
    return model


# ============================================================================ predict and evaluate
def _load_inputs(args):
    from .saving import load
    from .tables import read_table

    model = load(args.model)
    if model.input_names is None:
        raise _CommandError(f"{args.model}: the model takes images, not table columns")
    table = read_table(args.table)
    table.require(model.input_names, f"an input the model at {args.model} was trained on")
    return model, table, table.numeric(model.input_names)


def _check_draws(args) -> None:
    if args.num_samples is not None and args.num_samples < 1:
        raise _CommandError(f"--num-samples must be at least 1, got {args.num_samples}")
    if not 0.0 < args.interval < 1.0:
        raise _CommandError(f"--interval must be in (0, 1), got {args.interval}")


def _chunks(model, num_rows: int, args, fn) -> List:
    """``fn(rows, num_samples, seed)`` over the table's rows in chunks (a slice each; module
    docs)."""
    from .metrics import chunk_seed

    S = model.serving_samples if args.num_samples is None else args.num_samples
    return [
        fn(slice(start, start + CHUNK_ROWS), S, chunk_seed(args.seed, start, CHUNK_ROWS))
        for start in range(0, num_rows, CHUNK_ROWS)
    ]


def _regression(model, X: np.ndarray, args) -> Dict[str, np.ndarray]:
    """Per output column: mean, sd, lower and upper ``[N]``."""
    from .intervals import central_interval

    def one(rows, S, seed):
        mean, var = model.predict_y(X[rows], S, seed)
        cm, cv, lw = model.predict_y_components(X[rows], S, seed)
        lower, upper = central_interval(args.interval, cm.numpy(), cv.numpy(), lw.numpy())
        return mean.numpy(), np.sqrt(var.numpy()), lower, upper

    parts = _chunks(model, X.shape[0], args, one)
    mean, sd, lower, upper = (np.concatenate([p[k] for p in parts]) for k in range(4))
    names = model.output_names
    columns = {}
    for j, name in enumerate(names):
        prefix = "" if len(names) == 1 else f"{name}_"
        for key, value in (("mean", mean), ("sd", sd), ("lower", lower), ("upper", upper)):
            columns[prefix + key] = value[:, j]
    return columns


def _probabilities(model, X: np.ndarray, args) -> np.ndarray:
    return np.concatenate(
        _chunks(
            model,
            X.shape[0],
            args,
            lambda rows, S, seed: model.predict_proba(X[rows], S, seed).numpy(),
        )
    )


def _cmd_predict(args) -> int:
    from .tables import check_writable, write_table

    _check_draws(args)
    out = check_writable(args.out, args.overwrite)
    model, table, X = _load_inputs(args)
    if model.is_classifier:
        probs = _probabilities(model, X, args)
        columns = {f"prob_{name}": probs[:, c] for c, name in enumerate(model.class_names)}
    else:
        columns = _regression(model, X, args)
    write_table(out, columns, overwrite=args.overwrite)
    print(f"wrote {table.num_rows} rows ({', '.join(columns)}) to {out}")
    return 0


def _targets(model, table, column: str) -> np.ndarray:
    from .tables import ClassLabels

    if model.is_classifier:
        return ClassLabels(model.class_names).indices(table.cells(column), column, table.path)
    if model.record["target_dim"] != 1:
        raise _CommandError(
            f"the model predicts {model.record['target_dim']} columns; evaluate takes one --target"
        )
    return table.numeric([column])


def _cmd_evaluate(args) -> int:
    from .metrics import expected_calibration_error, top1_accuracy

    _check_draws(args)
    model, table, X = _load_inputs(args)
    table.require([args.target], "--target")
    Y = _targets(model, table, args.target)
    S = model.serving_samples if args.num_samples is None else args.num_samples
    logp = np.concatenate(
        _chunks(
            model,
            X.shape[0],
            args,
            lambda rows, S_, seed: model.predict_log_density((X[rows], Y[rows]), S_, seed).numpy(),
        )
    )
    record = {
        "table": table.path,
        "model": args.model,
        "rows": table.num_rows,
        "target": args.target,
        "num_samples": S,
        "seed": args.seed,
        "test_log_likelihood": float(np.mean(logp)),
    }
    if model.is_classifier:
        probs = _probabilities(model, X, args)
        record.update(
            accuracy=top1_accuracy(probs, Y[:, 0]), ece=expected_calibration_error(probs, Y[:, 0])
        )
    else:
        columns = _regression(model, X, args)
        mean, lower, upper = columns["mean"], columns["lower"], columns["upper"]
        y = Y[:, 0]
        record.update(
            rmse=float(np.sqrt(np.mean((mean - y) ** 2))),
            interval=args.interval,
            coverage=float(np.mean((lower <= y) & (y <= upper))),
        )
    print(json.dumps(record))
    return 0


# ============================================================================ the parsers
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 < value < 1.0 or math.isnan(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be in (0, 1)")
    return value


def add_run_flags(parser, verbose_help: str, *, progress: bool = True) -> None:
    """The flags that end a ``deepgp-gi`` command's arguments: ``--no-progress`` (with
    ``progress``) and the command's own ``--verbose`` (help ``verbose_help``; unset unless given,
    so that the top-level ``deepgp-gi --verbose`` stands)."""
    if progress:
        parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument(
        "--verbose", action="store_true", default=argparse.SUPPRESS, help=verbose_help
    )


def add_table_commands(sub, verbose_help: str) -> None:
    """Add ``fit``, ``predict`` and ``evaluate`` to the ``deepgp-gi`` subparsers ``sub`` (their
    arguments import nothing, so ``--help`` stays fast)."""
    fit = sub.add_parser(
        "fit",
        help="fit a deep GP to a CSV/Parquet table and save it",
        description="Fit a deep GP to the rows of TABLE (inputs and target standardised on it) "
        "and save it to --out (a directory: a TensorFlow SavedModel and its record).",
    )
    fit.add_argument(
        "table",
        metavar="TABLE",
        help="CSV file with a header row, or Parquet (.parquet, needs pyarrow)",
    )
    fit.add_argument("--target", required=True, metavar="COL", help="the column to predict")
    fit.add_argument(
        "--features",
        default=None,
        metavar="A,B,...",
        help="input columns (default: every column but the target)",
    )
    fit.add_argument(
        "--classes",
        action="store_true",
        help="fit a classifier (robust-max likelihood): the target holds labels 0..C-1 or class "
        "names",
    )
    fit.add_argument(
        "--posterior", default="mean_field", help="a deep-GP family (default mean_field)"
    )
    fit.add_argument(
        "--depth", type=_positive_int, default=2, help="number of GP layers (default 2)"
    )
    fit.add_argument("--steps", type=_positive_int, default=5000, help="Adam steps (default 5000)")
    fit.add_argument(
        "--num-inducing",
        type=_positive_int,
        default=None,
        help="inducing points M (default min(100, rows))",
    )
    fit.add_argument(
        "--batch-size", type=_positive_int, default=None, help="minibatch size (default: every row)"
    )
    fit.add_argument("--lr", type=float, default=0.01, help="Adam learning rate (default 0.01)")
    fit.add_argument(
        "--seed", type=int, default=0, help="seed of the initialisation and training (default 0)"
    )
    fit.add_argument(
        "--serving-samples",
        type=_positive_int,
        default=100,
        help="samples of the saved model's serving signature (default 100)",
    )
    fit.add_argument("--out", required=True, metavar="DIR", help="the saved model's directory")
    fit.add_argument("--overwrite", action="store_true", help="replace a saved model at --out")
    add_run_flags(fit, verbose_help)
    fit.set_defaults(func=lambda args: _run("fit", _cmd_fit, args))

    for name, help_text in (
        ("predict", "write predictions for the rows of a table"),
        ("evaluate", "print test log-likelihood, RMSE or accuracy, and coverage as JSON"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument(
            "model", metavar="DIR", help="a saved model (deepgp-gi fit, or deepgp_gi.save)"
        )
        p.add_argument(
            "table", metavar="TABLE", help="CSV or Parquet table with the model's input columns"
        )
        if name == "predict":
            p.add_argument(
                "--out",
                required=True,
                metavar="FILE",
                help="the predictions (CSV, or Parquet by suffix)",
            )
            p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
        else:
            p.add_argument(
                "--target", required=True, metavar="COL", help="the column of true values"
            )
        p.add_argument(
            "--interval",
            type=_probability,
            default=0.9,
            help="probability of the central predictive interval (default 0.9)",
        )
        p.add_argument(
            "--num-samples",
            type=int,
            default=None,
            help="Monte Carlo samples (default: the model's serving samples)",
        )
        p.add_argument("--seed", type=int, default=0, help="seed of the draws (default 0)")
        add_run_flags(p, verbose_help, progress=False)
        body = _cmd_predict if name == "predict" else _cmd_evaluate
        p.set_defaults(func=lambda args, name=name, body=body: _run(name, body, args))
