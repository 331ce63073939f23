"""Where the Gaussian noise variance goes when a deep GP trains on the predictive objective.

    python benchmarks/predictive_noise.py [--datasets boston,energy,wine]
        [--posteriors mean_field,dspp] [--objectives elbo,predictive] [--steps 1000]
        [--every 250] [--split 0] [--threads 1]
        [--out benchmarks/results/predictive_noise.jsonl]
        [--md benchmarks/results/predictive_noise.md]

Under the ELBO the expected log-likelihood charges the last layer's variance ``s`` at a row as
``-s / (2 noise)``, so the noise variance cannot fall far below the spread of the targets around
the fit. The predictive objective scores each row by ``log N(y; mu, s + noise)`` (one sample) or a
mixture of such terms (several samples, a DSPP's paths): only the sum ``s + noise`` enters, and the
fit is free to move the noise into ``s``. This measures where it goes: a depth-2 model (M = 100,
full batches, Adam 0.01, seed 0) on a UCI training split, for each family and objective, with the
likelihood's noise variance (standardised targets) every ``--every`` steps, and at the end the
mean variance of the last layer's ``f`` at the test rows (``predict_f``), the training objective
per row and the test log-likelihood per point (original units). The run is one ``fit`` resumed
from its checkpoint every ``--every`` steps (the same run as an uninterrupted one). One JSON line
per (data set, family, objective) goes to ``--out`` (those already there are skipped); ``--md``
gets the table, with this command.
"""

from __future__ import annotations

if not __package__:  # run by path: load benchmarks/ as the package (benchmarks/_by_path.py)
    import _by_path  # noqa: F401  (imported for its side effect)

import argparse
import os
import shlex
import sys
import tempfile
from typing import Dict, List

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

from benchmarks.common import (
    append_line,
    code_commit,
    commands_footer,
    read_lines,
    set_threads,
)

OUT = "benchmarks/results/predictive_noise.jsonl"
MD = "benchmarks/results/predictive_noise.md"


def run_one(dataset: str, posterior: str, objective: str, args) -> Dict:
    """Train one configuration (module docs) and return its result line."""
    import deepgp_gi as dg

    data = dg.datasets.load_uci(dataset, split=args.split)
    train = (data.X_train, data.Y_train)
    model = dg.build_deep_gp(
        data.X_train, data.Y_train, depth=2, posterior=posterior, num_inducing=100, seed=0
    )
    trace = []
    with tempfile.TemporaryDirectory() as checkpoints:
        for stop in range(args.every, args.steps + 1, args.every):
            history = dg.fit(
                model,
                train,
                steps=stop,
                seed=0,
                progress=False,
                objective=objective,
                checkpoint_dir=checkpoints,
                checkpoint_every=args.every,
            )
            trace.append([stop, float(model.likelihood.variance.numpy())])
    _, f_var = model.predict_f(data.X_test, num_samples=100, seed=0)
    return dict(
        dataset=dataset,
        posterior=posterior,
        objective=objective,
        split=args.split,
        steps=args.steps,
        noise_variance=trace,
        test_f_variance=float(np.mean(f_var)),
        train_objective_per_datapoint=float(history.elbo_per_datapoint[-1]),
        test_ll=float(
            dg.metrics.test_log_likelihood(model, data.X_test, data.Y_test, data.y_std, seed=0)
        ),
        commit=code_commit(),
        command=args.command,
    )


def report(lines: List[Dict]) -> str:
    """The markdown table of ``lines`` (one row each, in file order), with their commands."""
    import gpflow

    floor = gpflow.config.default_likelihood_positive_minimum()  # the Gaussian noise's floor
    out = [
        "# The noise variance under the predictive objective",
        "",
        "Depth 2, M = 100, full batches, Adam 0.01, seed 0, one training sample (a DSPP's ten",
        "paths are its samples); noise variance on standardised targets after each block of",
        f"steps (GPflow's floor is {floor:g}); the last layer's mean `f` variance at the",
        "test rows, the training objective per row and the test log-likelihood per point",
        "(original units) at the end.",
        "",
    ]
    if lines:
        stops = [s for s, _ in lines[0]["noise_variance"]]
        head = " | ".join(f"noise after {s:,}" for s in stops)
        out += [
            f"| data set | split | family | objective | {head} | test f variance "
            "| training objective per row | test LL |",
            "|---" * (7 + len(stops)) + "|",
        ]
        for line in lines:
            cells = " | ".join(f"{v:.1e}" for _, v in line["noise_variance"])
            out.append(
                f"| {line['dataset']} | {line['split']} | {line['posterior']} | "
                f"{line['objective']} | {cells} | {line['test_f_variance']:.3f} | "
                f"{line['train_objective_per_datapoint']:.2f} | {line['test_ll']:.2f} |"
            )
    out += commands_footer(lines)
    return "\n".join(out)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", default="boston,energy,wine")
    p.add_argument("--posteriors", default="mean_field,dspp")
    p.add_argument("--objectives", default="elbo,predictive")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--every", type=int, default=250)
    p.add_argument("--split", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=OUT)
    p.add_argument("--md", default=MD)
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args(argv)
    if args.every < 1 or args.steps < args.every or args.steps % args.every:
        p.error(f"--steps ({args.steps}) must be a positive multiple of --every ({args.every})")
    args.command = " ".join(["python benchmarks/predictive_noise.py", shlex.join(argv)]).rstrip()
    if not args.report_only:
        set_threads(args.threads)
        done = {
            (l["dataset"], l["posterior"], l["objective"], l["split"], l["steps"])
            for l in read_lines(args.out)
        }
        for dataset in args.datasets.split(","):
            for posterior in args.posteriors.split(","):
                for objective in args.objectives.split(","):
                    if (dataset, posterior, objective, args.split, args.steps) in done:
                        continue
                    line = run_one(dataset, posterior, objective, args)
                    append_line(args.out, line)
                    print(
                        f"{dataset} {posterior} {objective}: noise "
                        f"{line['noise_variance'][-1][1]:.1e}, test LL {line['test_ll']:.2f}",
                        flush=True,
                    )
    with open(args.md, "w") as fh:
        fh.write(report(read_lines(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
