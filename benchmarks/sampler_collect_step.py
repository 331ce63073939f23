"""Where does a sampler's sample set go when it is collected at a larger step than it trained at?

    python benchmarks/sampler_collect_step.py --dataset energy --split 0 --posterior bsgp
        [--collect-steps 0.01,0.03] [--steps 20000] [--threads 1] [--checkpoint-dir DIR]
        [--out benchmarks/results/sampler_collect_step.jsonl]
        [--md benchmarks/results/sampler_collect_step.md]

The validation protocol's configuration of a sampling family (``deepgp_gi.uci_protocol``: depth 2,
M = 100, 20,000 steps of Adam 0.01 on full batches, 10 % of the training split held out) is
trained once (resumable with ``--checkpoint-dir``) and its state kept; for each collection step the
chain then continues from that same state (``uci_protocol.SAMPLER_COLLECT``: 100 samples 50 steps
apart, as ``run_split`` collects them). One JSON line per (data set, split, family, step): the
validation LL and RMSE of the collected set, and, per sampled quantity (the whitened inducing
outputs ``V_l`` of every layer; for BSGP also the inducing inputs ``Z_l``, the log lengthscales and
the log kernel variance), how far the samples lie from the state at the end of training: the
root-mean-square change over the quantity's entries, its median over the samples and its value at
the last sample (a drift shows as a last sample farther than the median), and the largest change
of one entry over all samples. ``--md`` gets the table, with the commands.
"""

from __future__ import annotations

if not __package__:  # run by path: load benchmarks/ as the package (benchmarks/_by_path.py)
    import _by_path  # noqa: F401  (imported for its side effect)

import argparse
import shlex
import sys
from typing import Dict, List

import numpy as np

from benchmarks.common import (
    append_line,
    code_commit,
    commands_footer,
    read_lines,
    set_threads,
)

OUT = "benchmarks/results/sampler_collect_step.jsonl"
MD = "benchmarks/results/sampler_collect_step.md"
SAMPLING_FAMILIES = ("sghmc", "bsgp")


def quantity_names(posterior, depth: int) -> List[str]:
    """One name per entry of ``posterior.chain_variables()``, in its order."""
    names = [f"V_{l}" for l in range(depth)]
    if len(posterior.chain_variables()) == 4 * depth:  # BSGP: V, Z, log ell, log variance
        names += [f"Z_{l}" for l in range(depth)]
        names += [f"log_lengthscales_{l}" for l in range(depth)]
        names += [f"log_variance_{l}" for l in range(depth)]
    return names


def drift(samples: np.ndarray, end: np.ndarray) -> Dict[str, float]:
    """How far ``samples`` ``[S, ...]`` lie from ``end`` (the state at the end of training)."""
    delta = samples.reshape(samples.shape[0], -1) - end.reshape(1, -1)
    rms = np.sqrt(np.mean(delta**2, axis=1))
    return dict(
        end_rms=float(np.sqrt(np.mean(end**2))),
        median_rms_change=float(np.median(rms)),
        last_rms_change=float(rms[-1]),
        max_abs_change=float(np.max(np.abs(delta))),
    )


def run(args) -> List[Dict]:
    """Train once, then collect at each step from the trained state; the lines not yet in
    ``args.out``."""
    import deepgp_gi.metrics as metrics
    from deepgp_gi import uci_protocol
    from deepgp_gi.training import collect_samples, fit

    cfg = uci_protocol.normalise_config(
        dict(
            dataset=args.dataset,
            posterior=args.posterior,
            depth=2,
            validation=0.1,
            steps=args.steps,
        )
    )
    model, data = uci_protocol.build_model(cfg, args.split)
    N = data.X_train.shape[0]
    seed = cfg["seed"] + args.split
    fit(
        model,
        (data.X_train, data.Y_train),
        steps=cfg["steps"],
        batch_size=min(cfg["batch_size"] or 10000, N),
        learning_rate=cfg["learning_rate"],
        seed=seed,
        progress=args.progress,
        checkpoint_dir=args.checkpoint_dir,
    )
    trained = [v.numpy() for v in model.variables]
    names = quantity_names(model.posterior, cfg["depth"])
    end = [v.numpy() for v in model.posterior.chain_variables()]
    S, chunk = cfg["test_samples"], 1000
    lines = []
    for step in args.collect_steps:
        for v, value in zip(model.variables, trained):
            v.assign(value)
        collect_samples(
            model,
            (data.X_train, data.Y_train),
            num_samples=uci_protocol.SAMPLER_COLLECT["num_samples"],
            thin=uci_protocol.SAMPLER_COLLECT["thin"],
            seed=seed,
            batch_size=min(cfg["batch_size"] or 10000, N),
            progress=args.progress,
            step_size=step,
        )
        samples = [np.asarray(s) for s in model.posterior.samples]
        valid_ll = metrics.test_log_likelihood(
            model, data.X_valid, data.Y_valid, data.y_std, S, chunk, seed=seed
        )
        valid_rmse = metrics.rmse(
            model, data.X_valid, data.Y_valid, data.y_std, S, chunk, seed=seed
        )
        lines.append(
            dict(
                dataset=args.dataset,
                split=args.split,
                posterior=args.posterior,
                steps=cfg["steps"],
                collect_step=step,
                valid_ll=float(valid_ll),
                valid_rmse=float(valid_rmse),
                y_std=float(data.y_std),
                drift={n: drift(s, e) for n, s, e in zip(names, samples, end)},
                commit=code_commit(),
                command=args.command,
            )
        )
    return lines


def report(lines: List[Dict]) -> str:
    out = [
        "# A sampler's sample set collected at a larger step, quantity by quantity",
        "",
        "Depth 2, trained once (the line's steps at the training step 0.01, 10 % of the",
        "training split held out), then 100 samples 50 steps apart collected from that state at",
        "each step. Change: the root-mean-square change of the quantity's entries from the state",
        "at the end of training, median over the samples / at the last sample; largest: the",
        "largest change of one entry over all samples. Validation LL per point, original units.",
        "",
        "| data set | split | family | steps | collect step | valid LL | valid RMSE | quantity "
        "| end RMS | change, median / last | largest |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = ("dataset", "split", "posterior", "steps", "collect_step")
    for l in sorted(lines, key=lambda l: tuple(l[k] for k in order)):
        for k, (name, d) in enumerate(l["drift"].items()):
            head = (
                f"{l['dataset']} | {l['split']} | {l['posterior']} | {l['steps']:,} | "
                f"{l['collect_step']:g} | {l['valid_ll']:.2f} | {l['valid_rmse']:.2f}"
                if k == 0
                else " | | | | | |"
            )
            out.append(
                f"| {head} | {name} | {d['end_rms']:.3g} | {d['median_rms_change']:.3g} / "
                f"{d['last_rms_change']:.3g} | {d['max_abs_change']:.3g} |"
            )
    out += commands_footer(lines)
    return "\n".join(out)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="energy")
    p.add_argument("--split", type=int, default=0)
    p.add_argument("--posterior", default="bsgp", choices=SAMPLING_FAMILIES)
    p.add_argument("--collect-steps", default="0.01,0.03")
    p.add_argument(
        "--steps", type=int, default=20000, help="training steps (the protocol's 20,000)"
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--progress", action="store_true")
    p.add_argument("--out", default=OUT)
    p.add_argument("--md", default=MD)
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args(argv)
    args.command = " ".join(["python benchmarks/sampler_collect_step.py", *map(shlex.quote, argv)])
    args.collect_steps = [float(s) for s in args.collect_steps.split(",")]
    if not args.report_only:
        done = {
            (l["dataset"], l["split"], l["posterior"], l["steps"], l["collect_step"])
            for l in read_lines(args.out)
        }
        args.collect_steps = [
            s
            for s in args.collect_steps
            if (args.dataset, args.split, args.posterior, args.steps, s) not in done
        ]
        if args.collect_steps:
            set_threads(args.threads)
            for line in run(args):
                append_line(args.out, line)
                print(
                    f"{line['dataset']} split {line['split']} {line['posterior']} step "
                    f"{line['collect_step']:g}: valid LL {line['valid_ll']:.3f}",
                    flush=True,
                )
    with open(args.md, "w") as f:
        f.write(report(read_lines(args.out)))
    print(f"wrote {args.md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
