"""The ``deepgp-gi`` command: ``demo``, ``uci`` (the papers' UCI protocol), and ``fit``, ``predict``
and ``evaluate`` on a user's table (:mod:`deepgp_gi.table_commands`).

TensorFlow prints C++ log lines on stderr as it loads and on its first operation (``I0000 ...
cudart_stub.cc``, ``E0000 ... cuInit`` where there is no GPU, the oneDNN notice). The command
imports TensorFlow only after parsing its arguments and, unless ``--verbose``, sets
``TF_CPP_MIN_LOG_LEVEL=3`` first (a value already in the environment is kept) and drops the lines
TensorFlow prints before it reads that variable. ``TF_ENABLE_ONEDNN_OPTS`` is left alone (it
changes the numerics); only its notice goes. ``deepgp-gi --help`` does not import TensorFlow.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Tuple

import numpy as np

__all__ = ["main", "run_uci_split", "parse_splits"]

#: TF_CPP_MIN_LOG_LEVEL the command sets when the environment has none: 3 hides INFO, WARNING and
#: ERROR lines (2 would still print ``E0000 ... failed call to cuInit`` on a machine without a GPU).
QUIET_LOG_LEVEL = "3"
#: A TensorFlow (absl/glog-style) C++ log line: severity letter, MMDD, time (``12:34:56.789`` or,
#: before absl is initialised, ``00:00:1795619064.229781``), thread id, ``file:line]``.
_TF_LOG_LINE = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ [^\s\]]+:\d+\] ")
_ABSL_PREAMBLE = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
)
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}
_TABLE_NAMES = ("GP_POSTERIORS", "BNN_POSTERIORS", "BNN_PRIORS")


def _tables() -> Tuple[Tuple[str, ...], Tuple[str, ...], Tuple[str, ...]]:
    """The deep GP families, BNN families and BNN priors, read from the tables (imports
    TensorFlow)."""
    from .families import BNN_FAMILIES, DEEP_GP_FAMILIES
    from .priors import PRIORS

    return tuple(DEEP_GP_FAMILIES), tuple(BNN_FAMILIES), tuple(PRIORS)


def __getattr__(name: str):
    # GP_POSTERIORS, BNN_POSTERIORS, BNN_PRIORS: read from the tables on first use, so importing
    # this module does not import TensorFlow
    if name in _TABLE_NAMES:
        return dict(zip(_TABLE_NAMES, _tables()))[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _is_tf_log_line(line: str, level: int) -> bool:
    """Whether ``line`` is a TensorFlow C++ log line that ``TF_CPP_MIN_LOG_LEVEL=level`` hides."""
    if line.rstrip("\r\n") == _ABSL_PREAMBLE:
        return level >= 1
    m = _TF_LOG_LINE.match(line)
    return bool(m) and _SEVERITY[m.group(1)] < level


@contextlib.contextmanager
def _filtered_stderr(level: int):
    """Send file descriptor 2 to a temporary file for the block, then write back to it every line
    but the TensorFlow log lines below ``level`` (TensorFlow's shared libraries log as they load,
    before TensorFlow reads TF_CPP_MIN_LOG_LEVEL). A Python error or warning printed meanwhile is
    kept."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (AttributeError, OSError, ValueError):  # no file descriptor 2 (a windowless process)
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            try:
                sys.stderr.flush()
            except (AttributeError, OSError, ValueError):
                pass
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode("utf-8", errors="replace")
            kept = "".join(
                line for line in text.splitlines(keepends=True) if not _is_tf_log_line(line, level)
            )
            if kept:
                os.write(2, kept.encode("utf-8", errors="replace"))


def _import_tensorflow(verbose: bool) -> None:
    """Import TensorFlow, quietly unless ``verbose`` (see the module's docstring); a no-op once
    TensorFlow is imported."""
    if "tensorflow" in sys.modules:
        return
    if not verbose:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", QUIET_LOG_LEVEL)
    try:
        level = int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        level = 0
    with _filtered_stderr(level) if level > 0 and not verbose else contextlib.nullcontext():
        import tensorflow  # noqa: F401


def parse_splits(text: str, n_splits: int) -> List[int]:
    """``"0:20"`` (a Python-style range), ``"3"`` or ``"0,4,7"`` -> split numbers, checked."""
    try:
        if ":" in text:
            a, b = text.split(":", 1)
            splits = list(range(int(a or 0), min(int(b) if b else n_splits, n_splits)))
        else:
            splits = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(
            f"--splits {text!r} is not a range like 0:20 or a list like 0,3,5"
        ) from None
    bad = [s for s in splits if not 0 <= s < n_splits]
    if bad or not splits:
        raise ValueError(
            f"--splits {text!r} selects no valid split (the data set has {n_splits}: 0 to "
            f"{n_splits - 1})"
        )
    return splits


def _commit() -> str:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
        )
        return out.stdout.strip() or "unknown"
    except Exception:  # pragma: no cover - git missing
        return "unknown"


def run_uci_split(
    cfg: Dict, split: int, progress: bool = True, checkpoint_dir: Optional[str] = None
) -> Dict:
    """Fit one split with the configuration ``cfg`` and return the result record
    (:func:`deepgp_gi.uci_protocol.run_split`)."""
    from .uci_protocol import run_split

    return run_split(cfg, split, progress=progress, checkpoint_dir=checkpoint_dir)


def _summary(records: List[Dict]) -> str:
    lines = [
        f"{'data':<10} {'model':<24} {'splits':>6} {'test LL':>16} {'RMSE':>16} {'ELBO/N':>16}"
    ]
    groups: Dict[str, List[Dict]] = {}
    for r in records:
        label = (
            f"{r['posterior']}-{r['depth']}"
            if r["model"] == "gp"
            else f"bnn-{r['posterior']}-{r['prior']}"
        )
        groups.setdefault((r["dataset"], label), []).append(r)

    def fmt(values):  # mean ± one standard error; one split has no error bar, just its value
        v = np.asarray(values, dtype=float)
        if len(v) < 2:
            return f"{v.mean():8.3f}"
        return f"{v.mean():8.3f} ± {v.std(ddof=1) / math.sqrt(len(v)):5.3f}"

    for (name, label), rs in sorted(groups.items()):
        lines.append(
            f"{name:<10} {label:<24} {len(rs):>6} {fmt([r['test_ll'] for r in rs]):>16} "
            f"{fmt([r['rmse'] for r in rs]):>16} {fmt([r['elbo_per_datapoint'] for r in rs]):>16}"
        )
    return "\n".join(lines)


def _cmd_uci(args) -> int:
    from . import datasets
    from .uci_protocol import GLOBAL_LAST_LAYER, config_key, normalise_config

    model = "bnn" if args.model == "bnn" else "gp"
    gp_posteriors, bnn_posteriors, _ = _tables()
    choices = bnn_posteriors if model == "bnn" else gp_posteriors
    posterior = args.posterior or ("global" if model == "bnn" else "mean_field")
    if posterior not in choices:
        raise SystemExit(
            f"deepgp-gi uci: unknown --posterior {posterior!r} for --model {model}; choose one of "
            f"{', '.join(choices)}"
        )
    _, _, n_splits = datasets.load_uci_raw(args.dataset)
    splits = parse_splits(args.splits, n_splits)
    cfg = dict(
        model=model,
        dataset=datasets.load_uci(args.dataset, splits[0]).name,
        posterior=posterior,
        depth=args.depth if model == "gp" else len(args.hidden) + 1,
        prior=args.prior if model == "bnn" else None,
        hidden=list(args.hidden) if model == "bnn" else None,
        num_inducing=args.num_inducing,
        steps=args.steps,
        batch_size=args.batch_size,
        learning_rate=args.lr,
        train_samples=args.train_samples,
        test_samples=args.test_samples,
        seed=args.seed,
        positive_transform=args.positive_transform if model == "gp" else None,
        protocol=args.protocol,
        offdiagonal=args.offdiagonal if model == "gp" and posterior == "stripes_arrow" else None,
        last_layer=args.last_layer if (model, posterior) in GLOBAL_LAST_LAYER else None,
        learning_rate_decay=args.lr_decay,
        validation=args.validation,
        objective=args.objective,
        likelihood=args.likelihood,
        likelihood_df=args.likelihood_df,
    )
    cfg = normalise_config(cfg)
    done: Dict[int, Dict] = {}
    key = config_key(cfg)
    if args.out and os.path.exists(args.out):
        with open(args.out) as fh:
            for line in fh:
                line = line.strip()
                if line:
                    r = json.loads(line)
                    if config_key(r) == key:
                        done[r["split"]] = r
    records = []
    command = "deepgp-gi " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    for split in splits:
        if split in done:
            print(f"split {split}: already in {args.out}, skipped")
            records.append(done[split])
            continue
        valid = (
            f"-valid{cfg['validation']:g}" if cfg["validation"] else ""
        )  # not the full-split run's checkpoint
        if cfg["likelihood"]:  # nor the Gaussian's
            valid += f"-{cfg['likelihood']}{cfg['likelihood_df']:g}"
        ckpt = (
            os.path.join(args.checkpoint_dir, f"{cfg['dataset']}-{posterior}-{split}{valid}")
            if args.checkpoint_dir
            else None
        )
        r = run_uci_split(cfg, split, progress=not args.no_progress, checkpoint_dir=ckpt)
        r.update(commit=_commit(), command=command)
        valid = f"validation LL {r['valid_ll']:.4f}  " if "valid_ll" in r else ""
        print(
            f"split {split}: {valid}test LL {r['test_ll']:.4f}  RMSE {r['rmse']:.4f}  "
            f"ELBO/N {r['elbo_per_datapoint']:.4f}  ({r['train_time_s']:.0f} s)"
        )
        if args.out:
            with open(args.out, "a") as fh:
                fh.write(json.dumps(r) + "\n")
        records.append(r)
    print(_summary(records))
    return 0


def _cmd_demo(args) -> int:
    from . import datasets, metrics
    from .builders import build_deep_gp
    from .training import fit

    print(f"deepgp_gi demo: a depth-2 DSVI deep GP on UCI boston, split 0, {args.steps} Adam steps")
    data = datasets.load_uci("boston", 0)
    model = build_deep_gp(data.X_train, data.Y_train, depth=2, posterior="mean_field", seed=0)
    history = fit(
        model,
        (data.X_train, data.Y_train),
        steps=args.steps,
        learning_rate=0.01,
        seed=0,
        progress=not args.no_progress,
    )
    ll = metrics.test_log_likelihood(model, data.X_test, data.Y_test, data.y_std, num_samples=100)
    err = metrics.rmse(model, data.X_test, data.Y_test, data.y_std, num_samples=100)
    print(
        f"training ELBO per data point: {history.elbo_per_datapoint[-1]:.4f} "
        f"({history.wall_time[-1]:.0f} s)"
    )
    print(f"test log-likelihood: {ll:.4f} nats per point (original units)")
    print(f"test RMSE: {err:.4f} (original units)")
    return 0


def _hidden(text: str):
    try:
        widths = tuple(int(w) for w in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--hidden {text!r} must be comma-separated widths like 50,50"
        ) from None
    if not widths or min(widths) < 1:
        raise argparse.ArgumentTypeError(f"--hidden {text!r} must hold positive widths")
    return widths


def _lr_decay(text: str):
    """``RATE,EVERY`` -> ``[rate, every]``: the learning rate times ``rate`` every ``every`` steps
    (checked by :func:`~deepgp_gi.uci_protocol.check_learning_rate_decay`)."""
    from .uci_protocol import check_learning_rate_decay

    try:
        rate, every = text.split(",")
        return check_learning_rate_decay([float(rate), int(every)])
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"--lr-decay {text!r} must be RATE,EVERY with RATE in (0, 1] and EVERY a "
            f"positive number of steps, like 0.9,1000 ({err})"
        ) from None


def _validation(text: str) -> float:
    """``FRACTION`` -> the share of the training rows held out (checked by
    :func:`~deepgp_gi.datasets.uci.check_validation_fraction`)."""
    from .datasets.uci import check_validation_fraction

    try:
        return check_validation_fraction(float(text))
    except (TypeError, ValueError) as err:
        raise argparse.ArgumentTypeError(
            f"--validation {text!r} must be a fraction strictly between 0 and 1, like 0.1 ({err})"
        ) from None


_VERBOSE_HELP = (
    "show TensorFlow's C++ log lines (hidden by default: TF_CPP_MIN_LOG_LEVEL=3 unless set)"
)


def build_parser(tables: bool = True) -> argparse.ArgumentParser:
    """The argument parser; ``tables=False`` leaves out the ``uci`` command's arguments (they list
    the family tables, which import TensorFlow) for parsing anything but a ``uci`` command."""
    from .table_commands import add_run_flags, add_table_commands

    parser = argparse.ArgumentParser(
        prog="deepgp-gi", description="Deep GPs and BNNs with structured posteriors."
    )
    parser.add_argument("--verbose", action="store_true", help=_VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser(
        "demo", help="fit a depth-2 DSVI deep GP on boston split 0 and print test LL and RMSE"
    )
    demo.add_argument("--steps", type=int, default=5000, help="Adam steps (default 5000)")
    add_run_flags(demo, _VERBOSE_HELP)
    demo.set_defaults(func=_cmd_demo)

    add_table_commands(sub, _VERBOSE_HELP)  # fit, predict, evaluate on a user's table

    uci = sub.add_parser("uci", help="fit and evaluate on UCI splits with the papers' protocol")
    uci.set_defaults(func=_cmd_uci)
    if not tables:
        return parser
    GP_POSTERIORS, BNN_POSTERIORS, BNN_PRIORS = _tables()
    uci.add_argument(
        "--dataset",
        required=True,
        help="boston, concrete, energy, kin8nm, naval, power, protein, wine, yacht",
    )
    uci.add_argument(
        "--model", choices=("gp", "bnn"), default="gp", help="deep GP (default) or BNN"
    )
    uci.add_argument(
        "--posterior",
        default=None,
        help=f"gp: {', '.join(GP_POSTERIORS)} (default mean_field); bnn: "
        f"{', '.join(BNN_POSTERIORS)} (default global)",
    )
    uci.add_argument(
        "--depth", type=int, default=2, help="number of GP layers (gp only; default 2)"
    )
    uci.add_argument(
        "--hidden", type=_hidden, default=(50, 50), help="BNN hidden widths, e.g. 50,50 (bnn only)"
    )
    uci.add_argument(
        "--prior",
        choices=BNN_PRIORS,
        default="neal",
        help="BNN weight prior (bnn only; default neal)",
    )
    uci.add_argument(
        "--splits", default="0:20", help="splits as a range 0:20 or a list 0,3,5 (default 0:20)"
    )
    uci.add_argument(
        "--steps", type=int, default=20000, help="Adam steps per split (default 20000)"
    )
    uci.add_argument(
        "--batch-size", type=int, default=None, help="minibatch size (default min(10000, N))"
    )
    uci.add_argument("--lr", type=float, default=0.01, help="Adam learning rate (default 0.01)")
    uci.add_argument(
        "--lr-decay",
        type=_lr_decay,
        default=None,
        metavar="RATE,EVERY",
        help="multiply the learning rate by RATE every EVERY steps, e.g. 0.9,1000 (default: "
        "constant)",
    )
    uci.add_argument(
        "--num-inducing", type=int, default=100, help="inducing points M (default 100)"
    )
    uci.add_argument(
        "--train-samples",
        type=int,
        default=1,
        help="Monte Carlo samples per training step (default 1)",
    )
    uci.add_argument(
        "--test-samples",
        type=int,
        default=100,
        help="samples of the predictive mixture (default 100)",
    )
    uci.add_argument(
        "--seed", type=int, default=0, help="base seed; split k uses seed+k (default 0)"
    )
    uci.add_argument(
        "--protocol",
        choices=("random", "extrapolation"),
        default="random",
        help="random: the standard 90/10 splits (default); extrapolation: Lindinger et al.'s 50/50 "
        "split along a random 1-D projection of the inputs",
    )
    uci.add_argument(
        "--positive-transform",
        choices=("exp", "softplus"),
        default=None,
        help="transform of the kernels' positive hyperparameters (gp only; default: the family's)",
    )
    uci.add_argument(
        "--offdiagonal",
        choices=("preconditioned", "plain"),
        default=None,
        help="stripes_arrow only: store the stripe and arrow blocks preconditioned (whitened and "
        "scaled; the default) or plain (Lindinger et al.'s parameterisation)",
    )
    uci.add_argument(
        "--last-layer",
        choices=("marginal", "sampled"),
        default=None,
        help="a global-inducing last layer (gp global; bnn global, factorised_global, "
        "random_global): integrate its inducing outputs or weights out of the ELBO (marginal; the "
        "default) or sample them (sampled; O&A's algorithm)",
    )
    uci.add_argument(
        "--validation",
        type=_validation,
        nargs="?",
        const=0.1,
        default=None,
        metavar="FRACTION",
        help="hold out this share of each split's training rows (default with the flag: 0.1; rows "
        "from a permutation seeded by 1000 + split), train on the rest and record the "
        "validation LL and RMSE beside the test ones (default: no validation split)",
    )
    uci.add_argument(
        "--objective",
        choices=("elbo", "predictive"),
        default=None,
        help="what a deep GP trains on: the ELBO (default) or the predictive objective "
        "(variational families without a latent input; meant for posterior dspp)",
    )
    uci.add_argument(
        "--likelihood",
        choices=("gaussian", "student_t"),
        default=None,
        help="the targets' likelihood: Gaussian (default) or Student-t (deepgp_gi.likelihoods."
        "StudentT: a learned scale, --likelihood-df degrees of freedom)",
    )
    uci.add_argument(
        "--likelihood-df",
        type=float,
        default=None,
        metavar="DF",
        help="the Student-t's degrees of freedom, above 2 (default 4)",
    )
    uci.add_argument(
        "--out",
        default=None,
        help="append one JSON line per split here; splits already there are skipped",
    )
    uci.add_argument(
        "--checkpoint-dir", default=None, help="checkpoint each split's training here (resumable)"
    )
    add_run_flags(uci, _VERBOSE_HELP)
    return parser


def main(argv=None) -> int:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    argv = sys.argv[1:] if argv is None else list(argv)
    # TensorFlow is imported only once the arguments are known (quietly unless --verbose); a uci
    # command needs it to parse (its flags list the family tables), --help and demo --help do not.
    command = next((a for a in argv if not a.startswith("-")), None)
    if command == "uci":
        _import_tensorflow(verbose="--verbose" in argv)
    args = build_parser(tables=command == "uci").parse_args(argv)
    _import_tensorflow(verbose=args.verbose)
    try:
        return args.func(args)
    except (ValueError, TypeError) as err:
        print(f"deepgp-gi: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
