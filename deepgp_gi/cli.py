"""The ``deepgp-gi`` command: ``demo`` and ``uci`` (the papers' UCI protocol)."""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
from typing import Dict, List, Optional

import numpy as np

__all__ = ["main", "run_uci_split", "parse_splits"]

from .families import BNN_FAMILIES, DEEP_GP_FAMILIES  # noqa: E402
from .priors import PRIORS  # noqa: E402

GP_POSTERIORS = tuple(DEEP_GP_FAMILIES)
BNN_POSTERIORS = tuple(BNN_FAMILIES)
BNN_PRIORS = tuple(PRIORS)


def parse_splits(text: str, n_splits: int) -> List[int]:
    """``"0:20"`` (a Python-style range), ``"3"`` or ``"0,4,7"`` -> split numbers, checked."""
    try:
        if ":" in text:
            a, b = text.split(":", 1)
            splits = list(range(int(a or 0), min(int(b) if b else n_splits, n_splits)))
        else:
            splits = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--splits {text!r} is not a range like 0:20 or a list like 0,3,5") from None
    bad = [s for s in splits if not 0 <= s < n_splits]
    if bad or not splits:
        raise ValueError(f"--splits {text!r} selects no valid split (the data set has {n_splits}: 0 to {n_splits - 1})")
    return splits


def _commit() -> str:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except Exception:  # pragma: no cover - git missing
        return "unknown"


def run_uci_split(cfg: Dict, split: int, progress: bool = True, checkpoint_dir: Optional[str] = None) -> Dict:
    """Fit one split with the configuration ``cfg`` and return the result record
    (:func:`deepgp_gi.experiments.run_split`, shared with ``benchmarks/uci.py``)."""
    from .experiments import run_split

    return run_split(cfg, split, progress=progress, checkpoint_dir=checkpoint_dir)


def _summary(records: List[Dict]) -> str:
    lines = [f"{'data':<10} {'model':<24} {'splits':>6} {'test LL':>16} {'RMSE':>16} {'ELBO/N':>16}"]
    groups: Dict[str, List[Dict]] = {}
    for r in records:
        label = f"{r['posterior']}-{r['depth']}" if r["model"] == "gp" else f"bnn-{r['posterior']}-{r['prior']}"
        groups.setdefault((r["dataset"], label), []).append(r)

    def fmt(values):
        v = np.asarray(values, dtype=float)
        se = v.std(ddof=1) / math.sqrt(len(v)) if len(v) > 1 else float("nan")
        return f"{v.mean():8.3f} ± {se:5.3f}"

    for (name, label), rs in sorted(groups.items()):
        lines.append(
            f"{name:<10} {label:<24} {len(rs):>6} {fmt([r['test_ll'] for r in rs]):>16} "
            f"{fmt([r['rmse'] for r in rs]):>16} {fmt([r['elbo_per_datapoint'] for r in rs]):>16}"
        )
    return "\n".join(lines)


def _cmd_uci(args) -> int:
    from . import datasets
    from .experiments import GLOBAL_LAST_LAYER, config_key, normalise_config

    model = "bnn" if args.model == "bnn" else "gp"
    choices = BNN_POSTERIORS if model == "bnn" else GP_POSTERIORS
    posterior = args.posterior or ("global" if model == "bnn" else "mean_field")
    if posterior not in choices:
        raise SystemExit(f"deepgp-gi uci: unknown --posterior {posterior!r} for --model {model}; choose one of {', '.join(choices)}")
    _, _, n_splits = datasets.load_uci_raw(args.dataset)
    splits = parse_splits(args.splits, n_splits)
    cfg = dict(
        model=model, dataset=datasets.load_uci(args.dataset, splits[0]).name, posterior=posterior,
        depth=args.depth if model == "gp" else len(args.hidden) + 1,
        prior=args.prior if model == "bnn" else None, hidden=list(args.hidden) if model == "bnn" else None,
        num_inducing=args.num_inducing, steps=args.steps, batch_size=args.batch_size,
        learning_rate=args.lr, train_samples=args.train_samples, test_samples=args.test_samples, seed=args.seed,
        positive_transform=args.positive_transform if model == "gp" else None, protocol=args.protocol,
        offdiagonal=args.offdiagonal if model == "gp" and posterior == "stripes_arrow" else None,
        last_layer=args.last_layer if (model, posterior) in GLOBAL_LAST_LAYER else None,
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
        ckpt = os.path.join(args.checkpoint_dir, f"{cfg['dataset']}-{posterior}-{split}") if args.checkpoint_dir else None
        r = run_uci_split(cfg, split, progress=not args.no_progress, checkpoint_dir=ckpt)
        r.update(commit=_commit(), command=command)
        print(f"split {split}: test LL {r['test_ll']:.4f}  RMSE {r['rmse']:.4f}  ELBO/N {r['elbo_per_datapoint']:.4f}  ({r['train_time_s']:.0f} s)")
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
    history = fit(model, (data.X_train, data.Y_train), steps=args.steps, learning_rate=0.01, seed=0,
                  progress=not args.no_progress)
    ll = metrics.test_log_likelihood(model, data.X_test, data.Y_test, data.y_std, num_samples=100)
    err = metrics.rmse(model, data.X_test, data.Y_test, data.y_std, num_samples=100)
    print(f"training ELBO per data point: {history.elbo_per_datapoint[-1]:.4f} ({history.wall_time[-1]:.0f} s)")
    print(f"test log-likelihood: {ll:.4f} nats per point (original units)")
    print(f"test RMSE: {err:.4f} (original units)")
    return 0


def _hidden(text: str):
    try:
        widths = tuple(int(w) for w in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--hidden {text!r} must be comma-separated widths like 50,50") from None
    if not widths or min(widths) < 1:
        raise argparse.ArgumentTypeError(f"--hidden {text!r} must hold positive widths")
    return widths


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deepgp-gi", description="Deep GPs and BNNs with structured posteriors.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="fit a depth-2 DSVI deep GP on boston split 0 and print test LL and RMSE")
    demo.add_argument("--steps", type=int, default=5000, help="Adam steps (default 5000)")
    demo.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    demo.set_defaults(func=_cmd_demo)

    uci = sub.add_parser("uci", help="fit and evaluate on UCI splits with the papers' protocol")
    uci.add_argument("--dataset", required=True, help="boston, concrete, energy, kin8nm, naval, power, protein, wine, yacht")
    uci.add_argument("--model", choices=("gp", "bnn"), default="gp", help="deep GP (default) or BNN")
    uci.add_argument("--posterior", default=None,
                     help=f"gp: {', '.join(GP_POSTERIORS)} (default mean_field); bnn: {', '.join(BNN_POSTERIORS)} (default global)")
    uci.add_argument("--depth", type=int, default=2, help="number of GP layers (gp only; default 2)")
    uci.add_argument("--hidden", type=_hidden, default=(50, 50), help="BNN hidden widths, e.g. 50,50 (bnn only)")
    uci.add_argument("--prior", choices=BNN_PRIORS, default="neal", help="BNN weight prior (bnn only; default neal)")
    uci.add_argument("--splits", default="0:20", help="splits as a range 0:20 or a list 0,3,5 (default 0:20)")
    uci.add_argument("--steps", type=int, default=20000, help="Adam steps per split (default 20000)")
    uci.add_argument("--batch-size", type=int, default=None, help="minibatch size (default min(10000, N))")
    uci.add_argument("--lr", type=float, default=0.01, help="Adam learning rate (default 0.01)")
    uci.add_argument("--num-inducing", type=int, default=100, help="inducing points M (default 100)")
    uci.add_argument("--train-samples", type=int, default=1, help="Monte Carlo samples per training step (default 1)")
    uci.add_argument("--test-samples", type=int, default=100, help="samples of the predictive mixture (default 100)")
    uci.add_argument("--seed", type=int, default=0, help="base seed; split k uses seed+k (default 0)")
    uci.add_argument("--protocol", choices=("random", "extrapolation"), default="random",
                     help="random: the standard 90/10 splits (default); extrapolation: Lindinger et al.'s 50/50 split "
                          "along a random 1-D projection of the inputs")
    uci.add_argument("--positive-transform", choices=("exp", "softplus"), default=None,
                     help="transform of the kernels' positive hyperparameters (gp only; default: the family's)")
    uci.add_argument("--offdiagonal", choices=("preconditioned", "plain"), default=None,
                     help="stripes_arrow only: store the stripe and arrow blocks preconditioned (whitened and "
                          "scaled; the default) or plain (Lindinger et al.'s parameterisation)")
    uci.add_argument("--last-layer", choices=("marginal", "sampled"), default=None,
                     help="a global-inducing last layer (gp global; bnn global, factorised_global, random_global): "
                          "integrate its inducing outputs or weights out of the ELBO (marginal; the default) or "
                          "sample them (sampled; O&A's algorithm)")
    uci.add_argument("--out", default=None, help="append one JSON line per split here; splits already there are skipped")
    uci.add_argument("--checkpoint-dir", default=None, help="checkpoint each split's training here (resumable)")
    uci.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    uci.set_defaults(func=_cmd_uci)
    return parser


def main(argv=None) -> int:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError) as err:
        print(f"deepgp-gi: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
