"""UCI benchmark sweeps of the papers (deep GPs and BNNs): ``sweep`` appends results, \
``report`` tabulates.

    python benchmarks/uci.py sweep benchmarks/sweeps/uci.toml \
        --out benchmarks/results/uci/uci.jsonl \
        [--threads 1] [--jobs 1] [--checkpoint-dir DIR] [--only GROUP,...] [--dry-run]
    python benchmarks/uci.py report [--results benchmarks/results/uci] \
        [--out-dir benchmarks/results/uci]
    python benchmarks/uci.py layers SWEEP (--checkpoint-dir DIR | --untrained) [--only GROUP,...] \
        [--dataset D] [--posterior P] [--depth L] [--out FILE]

``sweep`` reads a TOML sweep file (see ``benchmarks/sweeps/uci.toml``): a ``[defaults]`` table and a
list of ``[[group]]`` tables, each with ``datasets``, ``posteriors``, ``splits`` and optionally
``depths`` (deep GPs), ``priors`` and ``learning_rates`` plus any configuration key of
:data:`deepgp_gi.uci_protocol.CONFIG_KEYS`. Groups run in file order; inside a group the split is
the outer loop, so a group's first split is complete over all its datasets and methods before the
next split starts. A group with ``chosen_from = "<result file>"`` (and only ``datasets`` and
``splits`` besides, ``refit`` and ``protocol``) runs, for each of its data sets, the configuration
the validation lines in that file choose when the sweep starts (:func:`choose_on_validation`), on
more splits than the choice was made on; with ``refit = true`` it retrains that configuration on the
whole training split of each split (no validation rows held out), as the papers train; with
``protocol`` it runs on that split protocol's splits instead (e.g. ``"random_80_20"``, the protocol
of a published number the choice is compared with). One JSON line per (configuration, split) is
appended (and flushed) as soon as it is done; lines already present are skipped, so an interrupted
sweep resumes where it stopped (with ``--checkpoint-dir`` even inside a split's training).

``report`` reads every ``*.jsonl`` under ``--results``, writes ``uci.md`` (mean ± one standard error
over splits beside the papers' numbers from ``paper_reference.csv``; for the lines trained with a
validation split, the configuration each data set's validation data choose,
:func:`choose_on_validation`) and PNG plots.

``layers`` looks inside runs still in training: for each deep-GP task of the sweep whose checkpoint
is in ``--checkpoint-dir``, it rebuilds the model, restores the latest checkpoint and prints (and
with ``--out`` appends to a markdown file) each layer's between-row and within-sample variance on
the training rows (:func:`deepgp_gi.uci_protocol.layer_variances_on_training_rows`, the numbers a
finished run records as ``layer_variances``); ``--untrained`` gives the same for the models as
initialised.
"""

from __future__ import annotations

if not __package__:  # run by path: load benchmarks/ as the package (benchmarks/_by_path.py)
    import _by_path  # noqa: F401

import argparse
import csv
import hashlib
import itertools
import json
import math
import os
import shlex
import shutil
import sys
import time
from collections import OrderedDict, defaultdict
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from benchmarks.common import append_line, code_commit, mean_se, read_lines, set_threads  # noqa: E402
from benchmarks.experiment_config import config_key, with_legacy_values  # noqa: E402
from deepgp_gi.metrics import steps_to_fraction  # noqa: E402
from deepgp_gi.uci_protocol import (  # noqa: E402
    CONFIG_KEYS,
    DEFAULTS,
    OFFDIAGONAL_DEFAULTS,
    normalise_config,
)

HERE = os.path.dirname(os.path.abspath(__file__))

DEFAULT_RESULTS = os.path.join(HERE, "results", "uci")
REFERENCE_CSV = os.path.join(DEFAULT_RESULTS, "paper_reference.csv")
REPORT_COMMAND = (
    "python benchmarks/uci.py report --results benchmarks/results/uci --out-dir "
    "benchmarks/results/uci"
)

# --------------------------------------------------------------------------------------------
# sweep
# --------------------------------------------------------------------------------------------

_GROUP_LISTS = {
    "datasets": "dataset",
    "posteriors": "posterior",
    "depths": "depth",
    "priors": "prior",
    "learning_rates": "learning_rate",
    "hiddens": "hidden",
}

#: The keys of a ``[[group]]`` that say how it runs rather than what it trains.
_GROUP_META = {"name", "splits", "note", "pending", "chosen_from", "refit"}


def load_sweep(path: str) -> List[Tuple[str, Dict, int]]:
    """Expand a TOML sweep file into ``(group name, configuration, split)`` tasks, in run order."""
    import tomllib

    with open(path, "rb") as fh:
        spec = tomllib.load(fh)
    defaults = spec.get("defaults", {})
    groups = spec.get("group", [])
    if not groups:
        raise ValueError(f"{path}: no [[group]] tables")
    tasks = []
    seen = set()
    for g_index, group in enumerate(groups):
        name = group.get("name", f"group{g_index}")
        unknown = set(group) - set(_GROUP_LISTS) - set(CONFIG_KEYS) - _GROUP_META
        if unknown:
            raise ValueError(f"{path}: group {name!r} has unknown keys {sorted(unknown)}")
        if "splits" not in group or "datasets" not in group:
            raise ValueError(f"{path}: group {name!r} needs 'datasets' and 'splits'")
        if "refit" in group and "chosen_from" not in group:
            raise ValueError(
                f"{path}: group {name!r}: refit retrains a choice and needs chosen_from"
            )
        if group.get(
            "pending"
        ):  # a group whose family or choice does not exist yet: listed, not run
            continue
        if "chosen_from" in group:
            configs = _chosen_configs(path, name, group)
        else:
            base = dict(defaults)
            base.update({k: v for k, v in group.items() if k in CONFIG_KEYS})
            axes = [(key, group[lst]) for lst, key in _GROUP_LISTS.items() if lst in group]
            configs = []
            for values in itertools.product(*[v for _, v in axes]):
                cfg = dict(base)
                cfg.update({key: v for (key, _), v in zip(axes, values)})
                configs.append(normalise_config(cfg))
        for split in group["splits"]:
            for cfg in configs:
                ident = (config_key(cfg), int(split))
                if ident not in seen:  # a task named by two groups runs once, in the first
                    seen.add(ident)
                    tasks.append((name, cfg, int(split)))
    return tasks


def _chosen_configs(path: str, name: str, group: Dict) -> List[Dict]:
    """The configurations a ``chosen_from`` group runs: for each of its ``datasets``, the one the
    validation lines in the file it names (relative to the repository root) choose
    (:func:`choose_on_validation`), as it stands when the sweep starts; a data set with no choice
    yet, or a file not yet written, has none. Such a group takes no configuration keys of its own
    (the choice is the configuration), only ``datasets``, ``splits``, ``refit`` (``true`` trains
    the choice on the whole training split: ``validation`` unset; :func:`refit_runs`) and
    ``protocol`` (the split protocol to run it on instead of the choice's own)."""
    extra = set(group) - _GROUP_META - {"datasets", "protocol"}
    if extra:
        raise ValueError(
            f"{path}: group {name!r} runs the configurations chosen on validation data and takes "
            f"no other keys, got {sorted(extra)}"
        )
    refit = group.get("refit", False)
    if not isinstance(refit, bool):
        raise ValueError(f"{path}: group {name!r}: refit must be true or false, got {refit!r}")
    source = os.path.join(os.path.dirname(HERE), group["chosen_from"])
    if not os.path.isdir(os.path.dirname(source)):
        raise ValueError(
            f"{path}: group {name!r}: chosen_from {group['chosen_from']!r} is not in a folder of "
            "the repository"
        )
    # a file not yet written (the sweep's own results, before its first line) chooses nothing
    chosen = choose_on_validation(read_records(source)) if os.path.isfile(source) else {}
    configs = []
    for dataset in group["datasets"]:
        if dataset in chosen:
            line = chosen[dataset]["config"]
            cfg = {k: line[k] for k in CONFIG_KEYS if k in line}
            if refit:
                cfg["validation"] = None
            if "protocol" in group:
                cfg["protocol"] = group["protocol"]
            configs.append(normalise_config(cfg))
    return configs


def pending_groups(path: str) -> List[Tuple[str, str]]:
    """``(group name, reason)`` of the sweep file's groups marked ``pending = "reason"``: they wait
    for a family or a choice that does not exist yet, so ``sweep`` skips them and ``report`` lists
    them."""
    import tomllib

    with open(path, "rb") as fh:
        groups = tomllib.load(fh).get("group", [])
    return [
        (g.get("name", f"group{i}"), str(g["pending"]))
        for i, g in enumerate(groups)
        if g.get("pending")
    ]


def group_progress(
    path: str, records: Iterable[Dict]
) -> List[Tuple[str, int, List[Tuple[Dict, int]]]]:
    """``(group name, runs done, tasks still to run)`` for each group of the sweep file that is not
    marked pending, in file order; a task counts as done when ``records`` holds a line of its
    configuration and split (a task two groups name belongs to the first)."""
    done = {(config_key(r), int(r["split"])) for r in records}
    out: "OrderedDict[str, List]" = OrderedDict()
    for name, cfg, split in load_sweep(path):
        entry = out.setdefault(name, [0, []])
        if (config_key(cfg), split) in done:
            entry[0] += 1
        else:
            entry[1].append((cfg, split))
    return [(name, n_done, todo) for name, (n_done, todo) in out.items()]


def read_records(path: str) -> List[Dict]:
    """Result lines with the configuration keys they predate filled in
    (:func:`with_legacy_values`)."""
    return [with_legacy_values(r) for r in read_lines(path)]


def done_set(path: str) -> set:
    """``(configuration key, split)`` of every line in the ``*.jsonl`` files of ``path``'s folder
    (the report reads them all, so a task finished into any of them is done; two sweeps with
    disjoint ``--only`` groups can run side by side into two files of one folder)."""
    folder = os.path.dirname(os.path.abspath(path))
    files = (
        [os.path.join(folder, f) for f in sorted(os.listdir(folder)) if f.endswith(".jsonl")]
        if os.path.isdir(folder)
        else []
    )
    return {(config_key(r), int(r["split"])) for f in files for r in read_lines(f)}


class SelectionError(ValueError):
    """A command-line selection (``--only``, ``--dataset``, ...) that names nothing in the sweep
    file."""


def selected_tasks(
    sweep: str,
    only: Optional[str],
    dataset: Optional[str] = None,
    posterior: Optional[str] = None,
    depth: Optional[int] = None,
    split: Optional[int] = None,
) -> List[Tuple[str, Dict, int]]:
    """The sweep file's tasks (:func:`load_sweep`), only those of the comma-separated groups
    ``only`` when given, and of them only the ones whose data set, family, depth and split equal the
    filters given. A group name the file does not have, or a filter no selected task matches, raises
    :class:`SelectionError` naming the option (a typo must not read as "nothing left to run")."""
    tasks = load_sweep(sweep)
    if only:
        keep = set(only.split(","))
        unknown = sorted(keep - {t[0] for t in tasks})
        if unknown:
            raise SelectionError(f"--only: no group {', '.join(map(repr, unknown))} in {sweep}")
        tasks = [t for t in tasks if t[0] in keep]
    for option, value, of in (
        ("--dataset", dataset, lambda t: t[1]["dataset"]),
        ("--posterior", posterior, lambda t: t[1]["posterior"]),
        ("--depth", depth, lambda t: t[1]["depth"]),
        ("--split", split, lambda t: t[2]),
    ):
        if value is None:
            continue
        kept = [t for t in tasks if of(t) == value]
        if not kept:
            have = sorted({str(of(t)) for t in tasks})
            raise SelectionError(
                f"{option} {value!r} matches no task of the selection (it has: {', '.join(have)})"
            )
        tasks = kept
    return tasks


def _task_dir(checkpoint_dir: Optional[str], cfg: Dict, split: int) -> Optional[str]:
    if not checkpoint_dir:
        return None
    h = hashlib.sha1(config_key(cfg).encode()).hexdigest()[:12]
    return os.path.join(
        checkpoint_dir, f"{cfg['dataset']}-{cfg['model']}-{cfg['posterior']}-{h}-split{split}"
    )


def _run_task(args):
    """Worker: run one (configuration, split); returns the record (or an error record)."""
    group, cfg, split, threads, checkpoint_dir, commit, command = args
    set_threads(threads)
    from deepgp_gi.uci_protocol import run_split

    ckpt = _task_dir(checkpoint_dir, cfg, split)
    record = run_split(cfg, split, progress=False, checkpoint_dir=ckpt)
    record.update(
        group=group,
        commit=commit,
        command=command,
        finished_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    if ckpt and os.path.isdir(ckpt):
        shutil.rmtree(ckpt, ignore_errors=True)
    return record


def cmd_sweep(args) -> int:
    tasks = selected_tasks(
        args.sweep, args.only, args.dataset, args.posterior, args.depth, args.split
    )
    done = done_set(args.out)
    pending = [t for t in tasks if (config_key(t[1]), t[2]) not in done]
    print(
        f"{len(tasks)} tasks in {args.sweep}; {len(tasks) - len(pending)} already in {args.out}; "
        f"{len(pending)} to run",
        flush=True,
    )
    for name, reason in pending_groups(args.sweep):
        print(f"  group {name} is pending: {reason}", flush=True)
    if args.dry_run:
        for group, cfg, split in pending:
            marks = "".join(f", {m}" for m in _protocol_marks(cfg))
            print(
                f"  {group}: {cfg['dataset']} {cfg['model']} {cfg['posterior']} depth "
                f"{cfg['depth']} prior {cfg['prior']} lr {cfg['learning_rate']} steps "
                f"{cfg['steps']} split {split}{marks}"
            )
        return 0
    if not pending:
        return 0
    set_threads(args.threads)
    commit = code_commit()
    command = "python benchmarks/uci.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    from tqdm import tqdm

    # progress in Adam steps (a task's cost is roughly proportional to its steps), so the ETA is
    # useful
    bar = tqdm(
        total=sum(c["steps"] for _, c, _ in tasks),
        initial=sum(c["steps"] for _, c, _ in tasks) - sum(c["steps"] for _, c, _ in pending),
        unit="step",
        desc="sweep",
        dynamic_ncols=True,
        file=sys.stderr,
        mininterval=5,
    )
    work = [(g, c, s, args.threads, args.checkpoint_dir, commit, command) for g, c, s in pending]
    failures = 0

    def finish(task, record):
        append_line(args.out, record)
        bar.update(task[1]["steps"])
        valid = f"valid LL {record['valid_ll']:.3f} " if "valid_ll" in record else ""
        bar.write(
            f"[{record['group']}] {record['dataset']} {record['posterior']} d{record['depth']} "
            f"split {record['split']}: {valid}test LL {record['test_ll']:.3f} RMSE "
            f"{record['rmse']:.3f} ELBO/N "
            f"{record['elbo_per_datapoint']:.3f}±{record['elbo_se_per_datapoint']:.3f} "
            f"({record['ms_per_step']:.1f} ms/step, {record['train_time_s']:.0f} s)"
        )

    if args.jobs <= 1:
        for task in work:
            try:
                finish(task, _run_task(task))
            except Exception as err:  # keep sweeping; the task stays pending for the next run
                failures += 1
                bar.write(
                    f"FAILED {task[0]} {task[1]['dataset']} {task[1]['posterior']} split "
                    f"{task[2]}: {err!r}"
                )
    else:
        import concurrent.futures as cf
        import multiprocessing as mp

        with cf.ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
            futures = {pool.submit(_run_task, task): task for task in work}
            for fut in cf.as_completed(futures):
                task = futures[fut]
                try:
                    finish(task, fut.result())
                except Exception as err:
                    failures += 1
                    bar.write(
                        f"FAILED {task[0]} {task[1]['dataset']} {task[1]['posterior']} split "
                        f"{task[2]}: {err!r}"
                    )
    bar.close()
    return 1 if failures else 0


# --------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------

METRICS = (("test_ll", "test LL"), ("rmse", "RMSE"), ("elbo_per_datapoint", "ELBO/N"))
#: What makes a table row: every configuration key but the learning rate and the seed (the runs of
#: a row differ only in those; see :func:`select_runs`).
_ROW_KEYS = tuple(k for k in CONFIG_KEYS if k not in ("learning_rate", "seed"))


def select_runs(records: List[Dict]) -> "OrderedDict[Tuple, List[Dict]]":
    """Group records into table rows; per split keep the learning rate with the best ELBO.

    Rows are keyed by ``_ROW_KEYS`` (everything but the learning rate and seed; a decaying learning
    rate is its own row, beside the constant one). When a split was run
    with several learning rates (the BNN protocol of O&A App. K), the run with the highest ELBO per
    datapoint is kept, as in the paper; a repeated line for the same configuration keeps the last.
    """
    per = OrderedDict()
    for r in records:
        row = tuple(json.dumps(r.get(k)) for k in _ROW_KEYS)
        per.setdefault(row, {}).setdefault(int(r["split"]), {})[r["learning_rate"]] = r
    out = OrderedDict()
    for row, splits in per.items():
        chosen = []
        for split in sorted(splits):
            chosen.append(max(splits[split].values(), key=lambda r: r["elbo_per_datapoint"]))
        out[row] = chosen
    return out


def load_reference(path: str = REFERENCE_CSV) -> Dict[Tuple, Dict]:
    """``(model, dataset, posterior, depth, prior) -> {metric: (mean, se, source, n_splits)}`` from
    the CSV (``n_splits`` is None when the CSV has no such column)."""
    ref: Dict[Tuple, Dict] = defaultdict(dict)
    if not os.path.exists(path):
        return ref
    with open(path) as fh:
        for row in csv.DictReader(r for r in fh if not r.startswith("#")):
            key = (
                row["model"],
                row["dataset"],
                row["posterior"],
                int(row["depth"]),
                row["prior"] or None,
            )
            n = row.get("n_splits")
            ref[key][row["metric"]] = (
                float(row["mean"]),
                float(row["se"]),
                row["source"],
                int(n) if n else None,
            )
    return ref


def within_two_se(
    ours: float, ours_se: float, paper: float, paper_se: float, paper_splits: Optional[int] = None
) -> Optional[bool]:
    """|ours - paper| <= 2 SE of the difference, sqrt(SE_ours^2 + SE_paper^2).

    With a single split of ours (no SE of its own), SE_ours is the paper's split-to-split standard
    deviation, ``SE_paper * sqrt(paper_splits)``: the spread one split would have if ours behaved
    like the paper's method (marked ``*`` in the tables). Without ``paper_splits`` there is no
    verdict then. A paper SE printed as 0.00 is read as 0.005, half its last digit.
    """
    if not (np.isfinite(ours) and np.isfinite(paper)):
        return None
    paper_se = max(
        paper_se, 0.005
    )  # the papers print two decimals: a printed 0.00 means below 0.005
    if not np.isfinite(ours_se):
        if not paper_splits:
            return None
        ours_se = paper_se * math.sqrt(paper_splits)
    return bool(abs(ours - paper) <= 2 * math.sqrt(ours_se**2 + paper_se**2))


def _fmt(m, se, digits=2):
    if not np.isfinite(m):
        return "—"
    return f"{m:.{digits}f} ± {se:.{digits}f}" if np.isfinite(se) else f"{m:.{digits}f} (1 split)"


def record_device(record: Dict) -> str:
    """The device a run trained on (``uci_protocol.training_device``); a record without the field
    predates it and ran on the CPU."""
    return record.get("device", "CPU")


def timing_runs(runs: List[Dict]) -> List[Dict]:
    """The runs whose recorded times a row reports: those trained on the CPU, or all of them when
    none did. A step on a GPU costs another amount, so a row's median over CPU and GPU splits
    would mean neither."""
    cpu = [r for r in runs if record_device(r) == "CPU"]
    return cpu or runs


def summarise(records: List[Dict], reference: Dict) -> List[Dict]:
    """One summary per table row: means, SEs, the paper's numbers and the 2-SE verdicts."""
    rows = []
    for key, runs in select_runs(records).items():
        r0 = runs[0]
        # the papers' numbers are for the plain models trained on the ELBO on the 90/10 splits: a
        # latent-variable row, one on another protocol or on the predictive objective is not
        # compared with them
        ref = (
            {}
            if r0.get("latent_dim")
            or r0.get("protocol", "random") != "random"
            or r0.get("objective") == "predictive"
            else reference.get(
                (r0["model"], r0["dataset"], r0["posterior"], r0["depth"], r0.get("prior")), {}
            )
        )
        s = {k: r0.get(k) for k in _ROW_KEYS}
        s["splits"] = [r["split"] for r in runs]
        s["learning_rates"] = sorted({r["learning_rate"] for r in runs})
        s["commits"] = sorted({r.get("commit", "?") for r in runs})
        s["ms_per_step"] = float(np.median([r["ms_per_step"] for r in timing_runs(runs)]))
        s["devices"] = sorted({record_device(r) for r in runs})
        s["elbo_se_max"] = float(max(r["elbo_se_per_datapoint"] for r in runs))
        for metric, _ in METRICS:
            m, se, n = mean_se(r[metric] for r in runs)
            s[metric] = (m, se)
            p = ref.get(metric)
            s["paper_" + metric] = p
            s["ok_" + metric] = within_two_se(m, se, p[0], p[1], p[3]) if p else None
        s["steps_to_99"] = [
            steps_to_fraction(r["trace"]["step"], r["trace"]["elbo_per_datapoint"])
            for r in runs
            if r.get("trace")
        ]
        s["steps_to_005"] = [
            steps_to_within(r["trace"]["step"], r["trace"]["elbo_per_datapoint"], 0.05)
            for r in runs
            if r.get("trace")
        ]
        rows.append(s)
    return rows


def steps_to_within(steps, values, tol: float) -> Optional[int]:
    """First step at which a smoothed ELBO trace comes within ``tol`` (nats per datapoint) of its
    final value (the mean of its last 5%)."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        return None
    final = float(np.mean(v[-max(1, len(v) // 20) :]))
    return int(steps[int(np.nonzero(v >= final - tol)[0][0])])


#: How a row trained on a seeded random protocol (:data:`deepgp_gi.datasets.uci.SEEDED_PROTOCOLS`)
#: is marked.
SEEDED_PROTOCOL_LABELS = {"random_80_20": "80/20 splits", "random_75_15_10": "75/15/10 splits"}
#: The protocols whose rows the tables show: the bundled random 90/10 splits and the seeded random
#: ones (each its own, marked row; the papers' numbers are compared with the 90/10 rows only).
TABLE_PROTOCOLS = ("random",) + tuple(SEEDED_PROTOCOL_LABELS)
#: How the published rows name the split protocol of each of ours.
PUBLISHED_PROTOCOL = {"random": "random 90/10", "random_80_20": "80/20"}


def _protocol_marks(s: Dict) -> List[str]:
    """A deep GP's training protocol where it is not the sweep's usual one sample at a constant
    learning rate, e.g. ``5 samples, lr 0.005 x0.98/1000`` (Lindinger et al.'s), a latent-variable
    model's latent dimension and importance samples, e.g. ``latent 1, K=5``, and the share of the
    training rows held out for validation, e.g. ``validation 10%`` (the model fitted the rest), and
    an objective other than the ELBO, ``predictive objective``; and the seeded random protocols
    (``80/20 splits``), several chain steps per hyperparameter step (``21 chain steps``), a
    constant KL weight (``KL weight 0.1``), an inner width other than the builder's
    (``width 5``), a likelihood other than the Gaussian (``Student-t, df 4``), a sampling
    family's collection step where it is not the training step (``collection step 0.03``), a floor
    on the noise variance (``noise floor 0.083``), a noise variance started elsewhere than the
    builders' default (``noise start 1``) and kernels started elsewhere
    (``kernel start havasi``)."""
    marks = []
    if s.get("protocol") in SEEDED_PROTOCOL_LABELS:  # the papers' own random splits
        marks.append(SEEDED_PROTOCOL_LABELS[s["protocol"]])
    if s.get("chain_steps"):
        marks.append(f"{s['chain_steps']} chain steps")
    if s.get("kl_weight"):
        marks.append(f"KL weight {s['kl_weight']:g}")
    if s.get("inner_width"):
        marks.append(f"width {s['inner_width']}")
    if s.get("likelihood") == "student_t":
        marks.append(f"Student-t, df {s['likelihood_df']:g}")
    if s.get("collect_step_size"):
        marks.append(f"collection step {s['collect_step_size']:g}")
    if s.get("noise_floor"):
        marks.append(f"noise floor {s['noise_floor']:.2g}")
    if s.get("noise_start"):
        marks.append(f"noise start {s['noise_start']:.2g}")
    if s.get("kernel_start"):
        marks.append(f"kernel start {s['kernel_start']}")
    if s.get("validation"):  # trained on the rest of the training rows
        marks.append(f"validation {s['validation']:.0%}")
    if s.get("objective"):  # trained on another objective than the ELBO
        marks.append(f"{s['objective']} objective")
    if s.get("latent_dim"):
        marks.append(f"latent {s['latent_dim']}, K={s.get('importance_samples') or 1}")
    if s.get("train_samples", 1) != 1:
        marks.append(f"{s['train_samples']} samples")
    decay = s.get("learning_rate_decay")
    if decay:
        # a result line has its learning rate, a table row (summarise) the rates of its lines
        rates = [s["learning_rate"]] if "learning_rate" in s else s["learning_rates"]
        marks.append(f"lr {'/'.join(f'{lr:g}' for lr in rates)} x{decay[0]:g}/{decay[1]}")
    return marks


def _method(s: Dict) -> str:
    """The row's method; a deep GP trained with another positive transform than its family's
    current default is marked, e.g. ``global (softplus)``, and a STAR posterior with plain
    off-diagonal blocks ``stripes_arrow (plain)``, and a global-inducing last layer that was
    sampled ``global (U_L sampled)`` (deep GP) or ``global (neal, W_L sampled)`` (BNN)."""
    if s["model"] == "gp":
        from deepgp_gi.families import DEEP_GP_FAMILIES

        family = DEEP_GP_FAMILIES.get(s["posterior"])
        pt = s.get("positive_transform")
        marks = []
        if family is not None and pt and pt != family.positive_transform:
            marks.append(pt)
        default = OFFDIAGONAL_DEFAULTS.get(s["posterior"])
        if default is not None and s.get("offdiagonal") not in (None, default):
            marks.append(s["offdiagonal"])
        if s.get("last_layer") == "sampled":
            marks.append("U_L sampled")
        marks += _protocol_marks(s)
        return f"{s['posterior']} ({', '.join(marks)})" if marks else s["posterior"]
    marks = [s["prior"]] + (["W_L sampled"] if s.get("last_layer") == "sampled" else [])
    return f"{s['posterior']} ({', '.join(marks)})"


def _one_split_mark(n_splits: int) -> str:
    """``*`` after a 2-SE verdict on one split of ours (judged against the paper's split spread)."""
    return "*" if n_splits < 2 else ""


def _verdict(ok, n_splits: int = 2) -> str:
    mark = _one_split_mark(n_splits)
    return "—" if ok is None else ("yes" + mark if ok else "**no**" + mark)


def render_markdown(rows: List[Dict], n_lines: int, sources: List[str]) -> str:
    out = [
        "# UCI benchmarks: results beside the papers' numbers",
        "",
        f"Regenerate: `{REPORT_COMMAND}`",
        "",
        f"{n_lines} result lines from {', '.join(sources)}. Each cell is the mean ± one standard "
        "error over the splits run (`(1 split)`: no SE yet). *Paper*: O&A (2021) Tables 8–10 (deep "
        "GPs: mean_field = their DSVI rerun, local = LI, global = GI) and Tables 5–7 (BNNs, Neal "
        "prior), from `paper_reference.csv`; the papers average 20 splits (deep GPs) and use "
        "20,000 (deep GP) or 10,000 (BNN) steps. *≤2SE*: |ours − paper| ≤ 2·sqrt(SE_ours² + "
        "SE_paper²); `*`: only one split of ours, whose SE is then taken as the paper's "
        "split-to-split standard deviation SE_paper·√n_paper (n_paper = 20 for O&A, 10 for "
        "Lindinger); a paper SE printed as 0.00 counts as 0.005. stripes_arrow and sghmc are "
        "compared with Lindinger et al. (2020) Table 1 (M = 128; their SGHMC rerun), bsgp with "
        "Rossi et al. (2021) supplement Table 2 (80/20 splits, number not stated: no one-split "
        "verdict); the samplers have no ELBO. Test LL and RMSE are in original units (S = 100); "
        "the ELBO per datapoint is on normalised targets and estimated to a standard error below "
        "0.01 per line.",
        "",
    ]
    for model, title in (("gp", "Deep GPs"), ("bnn", "BNNs (2 × 50 ReLU)")):
        mrows = [s for s in rows if s["model"] == model]
        if not mrows:
            continue
        out += [f"## {title}", "", f"Regenerate: `{REPORT_COMMAND}`", ""]
        for metric, label in METRICS:
            out += [
                f"### {label}",
                "",
                "| dataset | method | depth | M | steps | splits | ours | paper | ≤2SE |",
                "|---|---|---|---|---|---|---|---|---|",
            ]
            for s in sorted(
                mrows, key=lambda s: (s["dataset"], s["depth"], _method(s), s["steps"])
            ):
                m, se = s[metric]
                p = s["paper_" + metric]
                digits = 3 if metric == "rmse" and s["dataset"] in ("naval", "kin8nm") else 2
                paper = _fmt(p[0], p[1], digits) if p else "—"
                out.append(
                    f"| {s['dataset']} | {_method(s)} | {s['depth']} | {s['num_inducing']} | "
                    f"{s['steps']} | {len(s['splits'])} | {_fmt(m, se, digits)} | {paper} | "
                    f"{_verdict(s['ok_' + metric], len(s['splits']))} |"
                )
            out.append("")
    # global vs mean-field ELBO at the same depth, split by split
    out += [
        "## Global inducing vs mean-field ELBO (same dataset, depth, steps and splits)",
        "",
        f"Regenerate: `{REPORT_COMMAND}`",
        "",
        "| dataset | depth | steps | splits | ELBO/N mean_field | ELBO/N global | global ≥ "
        "mean_field |",
        "|---|---|---|---|---|---|---|",
    ]
    by = {(s["dataset"], s["depth"], s["steps"], _method(s)): s for s in rows if s["model"] == "gp"}
    for (d, depth, steps, post), s in sorted(by.items()):
        if post != "global" or (d, depth, steps, "mean_field") not in by:
            continue
        mf = by[(d, depth, steps, "mean_field")]
        common = sorted(set(s["splits"]) & set(mf["splits"]))
        if not common:
            continue
        out.append(
            f"| {d} | {depth} | {steps} | {len(common)} | {_fmt(*mf['elbo_per_datapoint'])} | "
            f"{_fmt(*s['elbo_per_datapoint'])} | "
            f"{'yes' if s['elbo_per_datapoint'][0] >= mf['elbo_per_datapoint'][0] else '**no**'} |"
        )
    out += [
        "",
        "## Steps to 99% of the final ELBO",
        "",
        f"Regenerate: `{REPORT_COMMAND}`",
        "",
        "First logged step at which the training ELBO (averaged over blocks of steps) has made 99% "
        "of its improvement from the first to the final value (the mean of the last 5% of the "
        "trace), and first step within 0.05 nats per datapoint of that final value. Mean over "
        "splits. The first ELBO values are very low (tens of nats below the final), so the 99% "
        "criterion is loose; the 0.05 one is the stricter. A run's final value is its own: compare "
        "families at the same step count (the 20,000-step rows).",
        "",
        "| dataset | method | depth | steps run | splits | steps to 99% | steps to final − 0.05 |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in sorted(
        rows, key=lambda s: (s["model"], s["dataset"], s["depth"], _method(s), s["steps"])
    ):
        vals = [v for v in s["steps_to_99"] if v is not None]
        near = [v for v in s["steps_to_005"] if v is not None]
        if vals:
            out.append(
                f"| {s['dataset']} | {_method(s)} | {s['depth']} | {s['steps']} | {len(vals)} | "
                f"{np.mean(vals):.0f} | {np.mean(near):.0f} |"
            )
    out += [
        "",
        "## Speed and provenance",
        "",
        "| dataset | method | depth | steps | median ms/step | max ELBO SE | commits |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in sorted(
        rows, key=lambda s: (s["model"], s["dataset"], s["depth"], _method(s), s["steps"])
    ):
        out.append(
            f"| {s['dataset']} | {_method(s)} | {s['depth']} | {s['steps']} | "
            f"{s['ms_per_step']:.1f} | {s['elbo_se_max']:.4f} | {', '.join(s['commits'])} |"
        )
    out += [
        "",
        "ms/step is wall time on a shared 2-core machine (one niced TensorFlow thread); compare "
        "only within one sweep run, as ratios.",
        "",
        "Plots: `test_ll_<dataset>.png`, `elbo_<dataset>.png` (one per data set), "
        "`convergence.png`.",
        "",
    ]
    return "\n".join(out)


#: The metrics drawn per data set: file prefix and axis label.
PLOTTED_METRICS = (
    ("test_ll", "test_ll", "test log-likelihood (nats)"),
    ("elbo_per_datapoint", "elbo", "ELBO per datapoint (nats)"),
)


def render_latent_comparison(records: List[Dict], command: str = REPORT_COMMAND) -> str:
    """Latent-variable deep GPs (``latent_dim``, trained with ``importance_samples`` K) against the
    plain model of the same family, depth, inducing points and steps, on the splits both have:
    test log-likelihood and RMSE of each, the paired difference of test LL (mean ± SE over the
    common splits), and the latent model's ms per step over the plain one's (each measured in its
    own sweep, so under whatever load each ran)."""
    runs = select_runs(records)
    plain = {}
    for key, rs in runs.items():
        r0 = rs[0]
        if r0["model"] == "gp" and not r0.get("latent_dim"):
            plain[
                tuple(
                    json.dumps(r0.get(k))
                    for k in _ROW_KEYS
                    if k not in ("latent_dim", "importance_samples")
                )
            ] = rs
    lines = []
    for key, rs in runs.items():
        r0 = rs[0]
        if r0["model"] != "gp" or not r0.get("latent_dim"):
            continue
        match = plain.get(
            tuple(
                json.dumps(r0.get(k))
                for k in _ROW_KEYS
                if k not in ("latent_dim", "importance_samples")
            )
        )
        by_split = {r["split"]: r for r in (match or [])}
        common = [r for r in rs if r["split"] in by_split]
        if not common:
            lines.append(
                f"| {r0['dataset']} | {r0['posterior']} | {r0['depth']} | {r0['latent_dim']} | "
                f"{r0.get('importance_samples') or 1} | 0 | — | — | — | — | — | no plain run on "
                "these splits |"
            )
            continue
        diffs = [r["test_ll"] - by_split[r["split"]]["test_ll"] for r in common]
        d, dse, _ = mean_se(diffs)
        lat, lse, _ = mean_se(r["test_ll"] for r in common)
        pl, pse, _ = mean_se(by_split[r["split"]]["test_ll"] for r in common)
        rmse_l = np.mean([r["rmse"] for r in common])
        rmse_p = np.mean([by_split[r["split"]]["rmse"] for r in common])
        cost = np.median([r["ms_per_step"] for r in common]) / np.median(
            [by_split[r["split"]]["ms_per_step"] for r in common]
        )
        if len(common) == 1:
            helps = f"{'+' if d > 0 else '−'} (1 split)"
        else:
            helps = "yes" if d - 2 * dse > 0 else ("no" if d + 2 * dse < 0 else "unclear")
        lines.append(
            f"| {r0['dataset']} | {r0['posterior']} | {r0['depth']} | {r0['latent_dim']} | "
            f"{r0.get('importance_samples') or 1} | {len(common)} | {_fmt(pl, pse)} | "
            f"{_fmt(lat, lse)} | {_fmt(d, dse)} | {rmse_p:.2f} / {rmse_l:.2f} | {cost:.1f} | "
            f"{helps} |"
        )
    if not lines:
        return ""
    return (
        "\n".join(
            [
                "",
                "## Latent-variable models against the plain family (same splits)",
                "",
                f"Regenerate: `{command}`",
                "",
                "A latent-variable deep GP (a `latent_dim`-dimensional w per point in front of the "
                "first layer, trained with the importance-weighted bound, K draws of w per point) "
                "against the plain model of the same family, depth, M and steps, on the splits "
                "both have. *Δ test LL* is latent minus plain, mean ± SE over those splits; "
                "*helps* says whether Δ is more than two SE above zero (yes), below it (no), or "
                "neither (unclear); with one split only the sign is given. *cost* is the latent "
                "model's median ms per step over the plain one's, each from its own sweep (the "
                "load of the machine differed).",
                "",
                "| dataset | family | depth | latent dim | K | splits | plain test LL | latent "
                "test LL | Δ test LL | RMSE plain / latent | cost (× plain) | helps |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|",
            ]
            + sorted(lines)
        )
        + "\n"
    )


#: K of the choice on validation data: a configuration is eligible when it has a validation line on
#: each of splits 0, ..., K - 1, and it is scored by its mean validation LL over exactly those
#: splits.
VALIDATION_SPLITS = 3

#: Two mean validation LLs closer than this count as a tie (:func:`choose_on_validation`).
VALIDATION_TIE = 1e-9

#: How the choice on validation data is named wherever its rows appear.
CHOSEN_ON_VALIDATION = "chosen on validation data"
#: How a row picked by its own test LL (the best mean test LL among the rows) is named.
PICKED_ON_TEST = "picked on test data"
#: How the chosen configuration's rows trained on the whole training split are named.
REFIT = "refit"


def validation_candidates(
    records: Iterable[Dict], k: int = VALIDATION_SPLITS
) -> "OrderedDict[str, List[Dict]]":
    """Per data set, every configuration with result lines trained on a validation split
    (``validation`` set; the random 90/10 splits only), in first-line order: a dict with ``config``
    (its first line), ``key`` (:func:`config_key`), ``runs`` (one line per split, the last of
    repeated lines, in split order), ``eligible`` (a line on every split ``0..k-1``, each with a
    finite validation LL), ``missing`` (those of splits ``0..k-1`` it lacks), ``valid_ll`` and
    ``valid_rmse`` (means over splits ``0..k-1``; NaN when not eligible), ``test_ll`` (mean, SE over
    all its splits) and ``ms_per_step`` (median over its splits)."""
    per: "OrderedDict[str, OrderedDict[str, Dict[int, Dict]]]" = OrderedDict()
    for r in records:
        if not r.get("validation") or r.get("protocol", "random") != "random":
            continue
        per.setdefault(r["dataset"], OrderedDict()).setdefault(config_key(r), {})[
            int(r["split"])
        ] = r
    out: "OrderedDict[str, List[Dict]]" = OrderedDict()
    for dataset, configs in per.items():
        cands = []
        for key, by_split in configs.items():
            runs = [by_split[s] for s in sorted(by_split)]
            first = [by_split[s] for s in range(k) if s in by_split]
            missing = [
                s
                for s in range(k)
                if s not in by_split or not np.isfinite(by_split[s].get("valid_ll", np.nan))
            ]
            eligible = not missing
            cands.append(
                dict(
                    config=runs[0],
                    key=key,
                    runs=runs,
                    eligible=eligible,
                    missing=missing,
                    valid_ll=float(np.mean([r["valid_ll"] for r in first]))
                    if eligible
                    else float("nan"),
                    valid_rmse=float(np.mean([r["valid_rmse"] for r in first]))
                    if eligible
                    else float("nan"),
                    test_ll=mean_se(r["test_ll"] for r in runs)[:2],
                    ms_per_step=float(np.median([r["ms_per_step"] for r in runs])),
                )
            )
        out[dataset] = cands
    return out


def choose_on_validation(
    records: Iterable[Dict], k: int = VALIDATION_SPLITS
) -> "OrderedDict[str, Dict]":
    """The configuration each data set's validation data choose, as a candidate of
    :func:`validation_candidates`; a data set with no eligible configuration has no entry.

    The rule: among the configurations (family, depth and every other option, learning rate and seed
    included) with a validation line on each of splits ``0..k-1``, take the one with the best mean
    validation log-likelihood over those ``k`` splits. A tie (means within :data:`VALIDATION_TIE`)
    goes to the cheaper configuration (lower median ms per step), then to the first in the order of
    the configuration keys. Its test log-likelihood is then reported over every split it has; the
    test LL plays no part in the choice."""
    chosen: "OrderedDict[str, Dict]" = OrderedDict()
    for dataset, cands in validation_candidates(records, k).items():
        eligible = [c for c in cands if c["eligible"]]
        if not eligible:
            continue
        best = max(c["valid_ll"] for c in eligible)
        tied = [c for c in eligible if c["valid_ll"] >= best - VALIDATION_TIE]
        chosen[dataset] = min(tied, key=lambda c: (c["ms_per_step"], c["key"]))
    return chosen


def refit_runs(
    records: Iterable[Dict], chosen: "OrderedDict[str, Dict]"
) -> "OrderedDict[str, List[Dict]]":
    """Per data set of ``chosen`` (:func:`choose_on_validation`): the lines of its chosen
    configuration trained on the whole training split, i.e. the same configuration with
    ``validation`` unset, on the random 90/10 splits (a ``refit = true`` group's lines, or any
    earlier line of that configuration), one per split (the last of repeated lines), in split
    order. A data set without such lines has no entry."""
    wanted = {d: config_key(dict(c["config"], validation=None)) for d, c in chosen.items()}
    per: Dict[str, Dict[int, Dict]] = {}
    for r in records:
        if r.get("validation") or r.get("protocol", "random") != "random":
            continue
        if r["dataset"] in wanted and config_key(r) == wanted[r["dataset"]]:
            per.setdefault(r["dataset"], {})[int(r["split"])] = r
    return OrderedDict((d, [per[d][s] for s in sorted(per[d])]) for d in chosen if d in per)


def _plain_method(s: Dict) -> str:
    """:func:`_method` of a row without its validation mark (for tables of validation rows only),
    with its inducing points where they are not the configuration default
    (``uci_protocol.DEFAULTS``), e.g. ``sghmc (M = 128)`` (these tables have no M column)."""
    name = _method(dict(s, validation=None))
    m = s.get("num_inducing")
    if m is None or m == DEFAULTS["num_inducing"]:
        return name
    return f"{name[:-1]}, M = {m})" if name.endswith(")") else f"{name} (M = {m})"


#: Short names of the papers' methods in ``paper_reference.csv`` (by our family name).
PAPER_METHOD_NAMES = {
    "mean_field": "DSVI",
    "local": "LI",
    "global": "GI",
    "stripes_arrow": "STAR",
    "sghmc": "SGHMC",
    "bsgp": "BSGP",
}


def published_from_reference(reference: Dict) -> List[Dict]:
    """The papers' deep-GP test log-likelihoods of :func:`load_reference` as rows like
    ``benchmarks/results/medium/published.csv``'s: ``dataset``, ``source`` (the paper: ``O&A``,
    ``Lindinger``, ``Rossi``), ``method`` (e.g. ``GI``), ``depth``, ``test_ll``, ``se``,
    ``n_splits``, ``protocol`` (``80/20`` for a source that says so, else ``random 90/10``)."""
    out = []
    for (model, dataset, posterior, depth, _prior), metrics in reference.items():
        if model != "gp" or "test_ll" not in metrics:
            continue
        mean, se, source, n = metrics["test_ll"]
        out.append(
            dict(
                dataset=dataset,
                source=source.split()[0],
                method=PAPER_METHOD_NAMES.get(posterior, posterior),
                depth=depth,
                test_ll=mean,
                se=se,
                n_splits=n,
                protocol="80/20" if "80/20" in source else "random 90/10",
            )
        )
    return out


#: The split protocol of the sweeps' random splits, as the published rows name it.
RANDOM_PROTOCOL = "random 90/10"


def best_published(
    dataset: str, published: List[Dict], protocol: Optional[str] = None
) -> Optional[Dict]:
    """The published row with the best test LL on ``dataset`` (of ``protocol`` only, when given)."""
    pub = [
        p
        for p in published
        if p["dataset"] == dataset and (protocol is None or p["protocol"] == protocol)
    ]
    return max(pub, key=lambda p: p["test_ll"]) if pub else None


def published_name(p: Dict) -> str:
    """A published row's name, e.g. ``Lindinger SGHMC-3`` (no depth suffix when the paper gives
    none)."""
    return f"{p['source']} {p['method']}{'-' + str(p['depth']) if p['depth'] else ''}"


def gap_text(ours: float, published: Optional[Dict], se: Optional[float] = None) -> str:
    """Our test LL minus a published one: ``at or above`` or the signed gap (a dash without one).
    With ``se`` (the standard error of our mean) a gap below is also given in standard errors of
    the difference, ``sqrt(se^2 + se_published^2)`` (the published SE where it is known), e.g.
    ``-0.21 (0.6 SE)``."""
    if published is None or not np.isfinite(ours):
        return "—"
    gap = ours - published["test_ll"]
    if gap >= 0:
        return "at or above"
    errors = [e for e in (se, published.get("se")) if e is not None and np.isfinite(e)]
    if se is None or not np.isfinite(se) or not errors or math.hypot(*errors) == 0:
        return f"{gap:+.2f}"
    return f"{gap:+.2f} ({-gap / math.hypot(*errors):.1f} SE)"


def validation_rule_text(k: int = VALIDATION_SPLITS) -> str:
    """The choice on validation data in one paragraph (the reports print it beside its rows)."""
    from deepgp_gi.datasets.uci import VALIDATION_SEED_OFFSET

    return (
        f"*{CHOSEN_ON_VALIDATION.capitalize()}*: a configuration trained with `validation` (the "
        "sweep key; `deepgp-gi uci --validation`) holds out 10 % of each split's training rows (a "
        f"permutation of them from `numpy.random.default_rng({VALIDATION_SEED_OFFSET} + split)`, "
        "the first round(0.1 N) held out; `deepgp_gi.datasets.load_uci(name, split, "
        "validation=0.1)`), fits the other 90 % (normalised with their own statistics) and records "
        "its log-likelihood on the held-out rows beside the test one. Per data set, among the "
        f"configurations with such a line on each of splits 0-{k - 1}, the one with the best mean "
        f"validation LL over those {k} splits is chosen (a tie goes to the lower median ms per "
        "step); its test LL is then the mean over every split it has, and the test rows play no "
        f"part in the choice. *{REFIT.capitalize()}*: the chosen configuration trained again on "
        "the whole training split of each split (nothing held out), as the papers train; the "
        "README's table reports it in place of the 90 % rows once it has as many splits as they "
        "have. "
        f"*{PICKED_ON_TEST.capitalize()}*: the row with the best mean test LL "
        "among the rows trained on the whole training splits, whose test LL both picked it and is "
        "reported (optimistic by the choice)."
    )


def selection_cost(records: Iterable[Dict], k: int = VALIDATION_SPLITS) -> List[Dict]:
    """What choosing on validation data costs on each data set with a choice: among the eligible
    candidates (:func:`validation_candidates`), the chosen one's mean test LL over splits
    ``0..k-1`` against the best of them on the same splits (``regret``, >= 0: the test LL the choice
    left on the table, measured on the splits the choice was made on), the number of held-out rows
    per split, with three or more candidates the rank correlation (Spearman) of their validation
    and test LLs over those splits, and with two or more how far the choice is ahead of the
    runner-up on validation (``runner_up``, the eligible candidate with the next best mean
    validation LL; ``margin`` and ``margin_se``, the mean and standard error over splits
    ``0..k-1`` of the chosen one's validation LL minus the runner-up's, paired by split). A dict
    per data set, in name order."""
    from scipy.stats import spearmanr

    out = []
    chosen = choose_on_validation(records, k)
    for dataset, cands in sorted(validation_candidates(records, k).items()):
        if dataset not in chosen:
            continue
        eligible = [c for c in cands if c["eligible"]]

        def first_test(c):
            return float(np.mean([r["test_ll"] for r in c["runs"] if int(r["split"]) < k]))

        tests = [first_test(c) for c in eligible]
        best = int(np.argmax(tests))
        mine = first_test(chosen[dataset])
        rho = (
            float(spearmanr([c["valid_ll"] for c in eligible], tests)[0])
            if len(eligible) >= 3
            else float("nan")
        )
        n_valid = [r.get("n_valid") for c in eligible for r in c["runs"] if r.get("n_valid")]
        others = [c for c in eligible if c["key"] != chosen[dataset]["key"]]
        runner_up = max(others, key=lambda c: c["valid_ll"]) if others else None
        margin, margin_se = (
            mean_se(first_valid(chosen[dataset], k) - first_valid(runner_up, k))[:2]
            if runner_up is not None
            else (float("nan"), float("nan"))
        )
        out.append(
            dict(
                dataset=dataset,
                candidates=len(eligible),
                n_valid=int(np.median(n_valid)) if n_valid else None,
                chosen=chosen[dataset],
                chosen_test=mine,
                best=eligible[best],
                best_test=tests[best],
                regret=tests[best] - mine,
                spearman=rho,
                runner_up=runner_up,
                margin=margin,
                margin_se=margin_se,
            )
        )
    return out


def first_valid(candidate: Dict, k: int = VALIDATION_SPLITS) -> np.ndarray:
    """``[k]``: an eligible candidate's (:func:`validation_candidates`) validation LL on each of
    splits ``0..k-1``."""
    by_split = {int(r["split"]): r["valid_ll"] for r in candidate["runs"]}
    return np.array([by_split[s] for s in range(k)], dtype=float)


def render_validation(
    records: List[Dict],
    published: List[Dict],
    command: str = REPORT_COMMAND,
    k: int = VALIDATION_SPLITS,
) -> str:
    """The section on the choice on validation data (:func:`choose_on_validation`): per data set
    with validation lines, the chosen configuration's test LL beside the best published number of
    the same protocol and beside the row picked by its own test LL; then every candidate with its
    validation and test LL. Empty when no line has a validation split."""
    cands = validation_candidates(records, k)
    if not cands:
        return ""
    chosen = choose_on_validation(records, k)
    refits = refit_runs(records, chosen)
    # the old way: the deep-GP row (whole training splits) with the best mean test LL
    full = summarise([r for r in records if r["model"] == "gp" and not r.get("validation")], {})
    out = [
        "",
        "## Chosen on validation data",
        "",
        f"Regenerate: `{command}`",
        "",
        validation_rule_text(k),
        "",
        f"| dataset | candidates ({k} splits) | {CHOSEN_ON_VALIDATION} | depth | steps | "
        f"validation LL (splits 0-{k - 1}) | test LL | splits | best published ({RANDOM_PROTOCOL}) "
        f"| gap | {REFIT}: test LL | splits | its gap | {PICKED_ON_TEST} (whole training splits) "
        "| its test LL |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for dataset in sorted(cands):
        eligible = sum(c["eligible"] for c in cands[dataset])
        ours = [s for s in full if s["dataset"] == dataset]
        top = max(ours, key=lambda s: s["test_ll"][0]) if ours else None
        top_cells = (
            (
                f"{_method(top)}, depth {top['depth']}, {top['steps']} steps, {len(top['splits'])} "
                f"split{'s' * (len(top['splits']) > 1)} | {_fmt(*top['test_ll'])}"
            )
            if top
            else "— | —"
        )
        c = chosen.get(dataset)
        if c is None:
            out.append(
                f"| {dataset} | {eligible} of {len(cands[dataset])} | none eligible yet | — | — | "
                f"— | — | — | — | — | — | — | — | {top_cells} |"
            )
            continue
        cfg, pub = c["config"], best_published(dataset, published, RANDOM_PROTOCOL)
        pub_cell = f"{published_name(pub)} {pub['test_ll']:.2f}" if pub else "—"
        refit = refits.get(dataset)
        if refit:
            refit_ll = mean_se(r["test_ll"] for r in refit)[:2]
            refit_cells = (
                f"{_fmt(*refit_ll)} | {len(refit)} | {gap_text(refit_ll[0], pub, se=refit_ll[1])}"
            )
        else:
            refit_cells = "— | — | —"
        out.append(
            f"| {dataset} | {eligible} of {len(cands[dataset])} | {_plain_method(cfg)} | "
            f"{cfg['depth']} | {cfg['steps']} | {c['valid_ll']:.2f} | {_fmt(*c['test_ll'])} | "
            f"{len(c['runs'])} | {pub_cell} | {gap_text(c['test_ll'][0], pub)} | {refit_cells} | "
            f"{top_cells} |"
        )
    out += [
        "",
        "Every configuration with validation lines (eligible: a line on each of splits "
        f"0-{k - 1}); validation LL and RMSE are means over those splits, the test LL over all its "
        "splits. Test LL, validation LL and RMSE in original units.",
        "",
        "| dataset | configuration | depth | steps | validation splits | validation LL "
        f"(0-{k - 1}) | validation RMSE | test LL | test splits | chosen |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for dataset in sorted(cands):
        ranked = sorted(
            cands[dataset],
            key=lambda c: (
                not c["eligible"],
                -c["valid_ll"] if c["eligible"] else 0,
                _plain_method(c["config"]),
                c["config"]["depth"],
            ),
        )
        for c in ranked:
            cfg = c["config"]
            splits = ", ".join(str(r["split"]) for r in c["runs"])
            if c["eligible"]:
                valid = f"{c['valid_ll']:.2f} | {c['valid_rmse']:.3g}"
            else:
                valid = (
                    f"not eligible: lacks split{'s' if len(c['missing']) > 1 else ''} "
                    f"{', '.join(map(str, c['missing']))} | —"
                )
            mark = "**yes**" if dataset in chosen and chosen[dataset]["key"] == c["key"] else ""
            out.append(
                f"| {dataset} | {_plain_method(cfg)} | {cfg['depth']} | {cfg['steps']} | {splits} "
                f"| {valid} | {_fmt(*c['test_ll'])} | {len(c['runs'])} | {mark} |"
            )
    costs = selection_cost(records, k)
    if costs:
        out += [
            "",
            f"What the choice costs, on splits 0-{k - 1} (the splits it was made on): the chosen "
            "configuration's mean test LL against the best eligible candidate's on the same "
            "splits (the regret: test LL the validation rows did not find), the held-out rows per "
            "split, with three or more candidates the rank correlation of their validation "
            "and test LLs, and how far the choice is ahead of the runner-up on validation (the "
            "mean ± SE over the splits of the difference of their validation LLs, split by split; "
            "a margin under two SE is within the noise of the held-out rows).",
            "",
            f"| dataset | eligible candidates | held-out rows per split | chosen | its test LL "
            f"(0-{k - 1}) | best on test | its test LL (0-{k - 1}) | regret | rank correlation "
            "| runner-up on validation | validation margin |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]

        def named(cfg):  # mean_field-2, global-2 (latent 1, K=5)
            family, _, marks = _plain_method(cfg).partition(" (")
            return f"{family}-{cfg['depth']}" + (f" ({marks}" if marks else "")

        for c in costs:
            rho = "—" if math.isnan(c["spearman"]) else f"{c['spearman']:.2f}"
            runner_up, margin = "—", "—"
            if c["runner_up"] is not None:
                runner_up = named(c["runner_up"]["config"])
                margin = f"{c['margin']:+.3f} ± {c['margin_se']:.3f}"
            out.append(
                f"| {c['dataset']} | {c['candidates']} | {c['n_valid'] or '—'} | "
                f"{named(c['chosen']['config'])} | {c['chosen_test']:.2f} | "
                f"{named(c['best']['config'])} | {c['best_test']:.2f} | {c['regret']:.2f} | {rho} "
                f"| {runner_up} | {margin} |"
            )
    out += render_pointwise(chosen)
    return "\n".join(out) + "\n"


#: How many of a split's lowest test points :func:`lowest_points` sets apart.
LOWEST_POINTS = 3


def lowest_points(points: Sequence[float], n: int = LOWEST_POINTS) -> Dict:
    """Where a split's test LL falls: its mean over ``points`` (each test point's log predictive
    density), the ``n`` lowest of them and the mean of the rest, e.g. ``{"test_ll": -1.27,
    "lowest": [-41.2, -18.0, -6.3], "rest": -0.43, "n": 77}``."""
    lpd = np.sort(np.asarray(points, dtype=float))
    if lpd.ndim != 1 or len(lpd) <= n:
        raise ValueError(f"points: need more than {n} test points, got shape {lpd.shape}")
    return dict(
        test_ll=float(lpd.mean()), lowest=lpd[:n].tolist(), rest=float(lpd[n:].mean()), n=len(lpd)
    )


def render_pointwise(chosen: "OrderedDict[str, Dict]") -> List[str]:
    """Markdown lines: per chosen configuration and split whose line has ``test_ll_points``, the
    test LL, its :data:`LOWEST_POINTS` lowest points and the mean of the rest (none without such
    lines)."""
    rows = []
    for dataset, c in chosen.items():
        for r in c["runs"]:
            if r.get("test_ll_points"):
                low = lowest_points(r["test_ll_points"])
                rows.append(
                    f"| {dataset} | {r['split']} | {low['test_ll']:.2f} | "
                    f"{', '.join(f'{v:.1f}' for v in low['lowest'])} | {low['rest']:.2f} | "
                    f"{low['n']} |"
                )
    if not rows:
        return []
    return [
        "",
        f"Where the chosen configurations' test LL falls, split by split (the lines that record "
        "each test point's log density): the mean over all the split's points (the test LL from "
        "their own Monte Carlo draw, so it may differ from the line's in the second decimal), its "
        f"{LOWEST_POINTS} lowest points and the mean over the other test points.",
        "",
        f"| dataset | split | mean of all points | {LOWEST_POINTS} lowest points | "
        "mean of the rest | test points |",
        "|---|---|---|---|---|---|",
    ] + rows


def plot_metric(rows: List[Dict], metric: str, label: str, path_prefix: str) -> List[str]:
    """One figure per data set, ``{path_prefix}_{dataset}.png``: a row per configuration (model,
    family, depth, step budget) that has the metric (the samplers have no ELBO), the deep GPs and
    the BNNs in panels of their own. Ours: the family's colour, the depth's marker, filled with its
    SE bar when a mean over splits and hollow when one split; the paper's: a black cross with its
    SE. Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks import plot_style

    written = []
    for d in sorted({s["dataset"] for s in rows}):
        drows = sorted(
            [s for s in rows if s["dataset"] == d and np.isfinite(s[metric][0])],
            key=lambda s: (s["model"] != "gp", _method(s), s["depth"], s["steps"]),
        )
        groups = [
            (model, [s for s in drows if s["model"] == model])
            for model in ("gp", "bnn")
            if any(s["model"] == model for s in drows)
        ]
        if not groups:
            continue
        # a row far off the others (10 interquartile ranges) would squeeze them: it is drawn as
        # an arrow at the edge, its value written beside it
        means = np.array([s[metric][0] for s in drows])
        q25, q75 = np.percentile(means, [25, 75])
        reach = 10 * max(q75 - q25, 0.1)
        inside = [s for s in drows if q25 - reach <= s[metric][0] <= q75 + reach]
        ends = [
            m + k * (se if np.isfinite(se) else 0)
            for s in inside
            for m, se in [s[metric][:2]]
            + ([s["paper_" + metric][:2]] if s["paper_" + metric] else [])
            for k in (-1, 1)
        ]
        pad = 0.06 * (max(ends) - min(ends) + 1e-9)
        xlim = (min(ends) - pad, max(ends) + pad)
        heights = [len(g) + 1.5 for _, g in groups]
        fig, axes = plt.subplots(
            len(groups),
            1,
            figsize=(10.5, 1.6 + 0.3 * sum(heights)),
            sharex=True,
            squeeze=False,
            gridspec_kw={"height_ratios": heights},
        )
        for ax, (model, grows) in zip(axes[:, 0], groups):
            paper = False
            for i, s in enumerate(grows):
                m, se = s[metric]
                if not xlim[0] <= m <= xlim[1]:  # off the scale: an arrow at the edge
                    edge = xlim[0] if m < xlim[0] else xlim[1]
                    ax.plot(
                        [edge],
                        [i],
                        "<" if m < xlim[0] else ">",
                        color=plot_style.family_colour(_method(s), model),
                        markersize=8,
                        clip_on=False,
                    )
                    ax.annotate(
                        f"off scale: {m:.2f}" + (f" ± {se:.2f}" if np.isfinite(se) else ""),
                        (edge, i),
                        xytext=(10 if m < xlim[0] else -10, 0),
                        textcoords="offset points",
                        ha="left" if m < xlim[0] else "right",
                        va="center",
                        fontsize=7,
                    )
                    m = float("nan")
                plot_style.errorbar_or_point(
                    ax,
                    m,
                    i,
                    se,
                    len(s["splits"]),
                    plot_style.family_colour(_method(s), model),
                    plot_style.depth_marker(s["depth"]),
                    horizontal=True,
                    markersize=6,
                )
                p = s["paper_" + metric]
                if p:
                    paper = True
                    ax.errorbar(
                        [p[0]],
                        [i + 0.3],
                        xerr=[[p[1]]],
                        fmt="x",
                        color=plot_style.REFERENCE_COLOUR,
                        ecolor="0.5",
                        markersize=5,
                        capsize=2,
                    )
            ax.set_yticks(range(len(grows)))
            ax.set_yticklabels(
                [
                    f"{_method(s)}, depth {s['depth']}, {s['steps']:,} steps, "
                    f"{len(s['splits'])} split{'s' if len(s['splits']) > 1 else ''}"
                    for s in grows
                ],
                fontsize=8,
            )
            ax.set_ylim(len(grows) - 0.4, -0.6)
            ax.set_xlim(*xlim)
            ax.set_title(f"{d}: {'deep GPs' if model == 'gp' else 'BNNs'}", fontsize=9)
            ax.grid(axis="x", alpha=0.3)
            ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(6))
            families = plot_style.family_order(
                (plot_style.base_family(_method(s)) for s in grows), model
            )
            handles = (
                plot_style.family_handles(families, model)
                + plot_style.depth_handles(s["depth"] for s in grows)
                + plot_style.split_handles(
                    multi=any(len(s["splits"]) > 1 for s in grows),
                    single=any(len(s["splits"]) == 1 for s in grows),
                )
            )
            if paper:
                handles.append(
                    plt.Line2D(
                        [],
                        [],
                        color=plot_style.REFERENCE_COLOUR,
                        marker="x",
                        ls="",
                        label="paper (mean ± SE)",
                    )
                )
            plot_style.legend_outside(ax, handles=handles, fontsize=8)
        axes[-1, 0].set_xlabel(label)
        axes[-1, 0].tick_params(axis="x", labelbottom=True)
        fig.tight_layout()
        path = f"{path_prefix}_{d}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written


def plot_convergence(
    records: List[Dict],
    path: str,
    datasets=("boston", "energy"),
    posteriors=("mean_field", "global"),
) -> bool:
    """ELBO per datapoint against step (split 0, depth 2, the longest run of each family with its
    current defaults: older rows such as ``global (softplus)`` are left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks import plot_style

    ref = load_reference()
    fig, axes = plt.subplots(1, len(datasets), figsize=(5 * len(datasets), 3.8), squeeze=False)
    drawn = False
    for ax, d in zip(axes[0], datasets):
        for c, post in enumerate(posteriors):
            cands = [
                r
                for r in records
                if r["model"] == "gp"
                and r["dataset"] == d
                and _method(r) == post
                and r["depth"] == 2
                and r["split"] == 0
                and r.get("trace")
            ]
            if not cands:
                continue
            r = max(cands, key=lambda r: r["steps"])
            ax.plot(
                r["trace"]["step"],
                r["trace"]["elbo_per_datapoint"],
                color=plot_style.family_colour(post),
                label=f"{post} ({r['steps']} steps)",
            )
            p = ref.get(("gp", d, post, 2, None), {}).get("elbo_per_datapoint")
            if p:
                ax.axhline(
                    p[0],
                    color=plot_style.family_colour(post),
                    ls="--",
                    lw=1,
                    label=f"{post}: paper (mean of 20 splits)",
                )
            drawn = True
        ax.set_title(f"{d}, depth 2, split 0")
        ax.set_xlabel("Adam step")
        ax.set_ylabel("training ELBO per datapoint (nats)")
        vals = [v for line in ax.get_lines() for v in line.get_ydata()]
        if vals:
            lo = np.percentile(vals, 5)
            ax.set_ylim(
                lo - 0.2 * (max(vals) - lo + 1e-9), max(vals) + 0.1 * (max(vals) - lo + 1e-9)
            )
        plot_style.legend_outside(ax, where="below", ncol=2)
    fig.suptitle(f"Regenerate: {REPORT_COMMAND}", fontsize=7)
    fig.tight_layout()
    if drawn:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return drawn


#: Lindinger et al. (2020) Table 2: frequency with which STAR's test log density beats mean-field's
#: on the test points of the extrapolation split (3 layers; mean (SE) over 10 repetitions).
LINDINGER_STAR_BEATS_MF = {
    "boston": (0.55, 0.04),
    "energy": (0.73, 0.05),
    "concrete": (0.57, 0.04),
    "wine": (0.57, 0.04),
    "kin8nm": (0.36, 0.03),
    "power": (0.44, 0.06),
    "naval": (0.67, 0.06),
    "protein": (0.49, 0.03),
}


def _extrapolation_runs(records: List[Dict]) -> "OrderedDict[Tuple, List[Dict]]":
    """Extrapolation lines grouped by (dataset, depth, steps, method); one line per split (the
    last)."""
    groups: "OrderedDict[Tuple, Dict[int, Dict]]" = OrderedDict()
    for r in records:
        groups.setdefault((r["dataset"], r["depth"], r["steps"], _method(r)), {})[
            int(r["split"])
        ] = r
    return OrderedDict((k, [v[s] for s in sorted(v)]) for k, v in groups.items())


def star_beats_frequency(star: Dict, rival: Dict) -> float:
    """Fraction of the test points at which ``star``'s log predictive density exceeds ``rival``'s
    (two lines of the same dataset and split; ties count half)."""
    a, b = np.asarray(star["test_ll_points"]), np.asarray(rival["test_ll_points"])
    if a.shape != b.shape:
        raise ValueError(f"lines of split {star['split']} have {a.size} and {b.size} test points")
    return float(np.mean((a > b) + 0.5 * (a == b)))


def render_extrapolation(records: List[Dict]) -> str:
    """The extrapolation section of the report: test LL / RMSE per method, the point-by-point
    frequency with which stripes_arrow beats each rival (Lindinger Table 2), and the calibration
    error of the central predictive intervals (Lindinger Fig. 3: ``calibration.png``)."""
    from deepgp_gi.metrics import calibration_curve

    runs = _extrapolation_runs(records)
    out = [
        "",
        "## Extrapolation (Lindinger et al. 2020 protocol)",
        "",
        f"Regenerate: `{REPORT_COMMAND}`",
        "",
        '`dg.datasets.load_uci(name, split=k, protocol="extrapolation")`: a random 1-D projection '
        "of the standardised inputs drawn from seed k; train on the lower half, test on the upper "
        "half. Mean ± one standard error over the splits run. *calibration error*: mean |observed "
        "− nominal| coverage of the central predictive intervals at levels 0.05, 0.10, …, 1.0 (0 "
        "is perfectly calibrated; pooled over splits); *coverage 90%*: the fraction of test "
        "targets inside the central 90% interval.",
        "",
        "| dataset | method | depth | steps | splits | test LL | RMSE | ELBO/N | calibration error "
        "| coverage 90% |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (d, depth, steps, method), rs in sorted(runs.items()):
        ll, rm, el = (mean_se(r[k] for r in rs) for k in ("test_ll", "rmse", "elbo_per_datapoint"))
        pit = np.concatenate([np.asarray(r["test_pit"]) for r in rs])
        levels, observed = calibration_curve(pit)
        cov90 = calibration_curve(pit, np.array([0.9]))[1][0]
        out.append(
            f"| {d} | {method} | {depth} | {steps} | {len(rs)} | {_fmt(ll[0], ll[1])} | "
            f"{_fmt(rm[0], rm[1])} | {_fmt(el[0], el[1])} | "
            f"{np.mean(np.abs(observed - levels)):.3f} | {cov90:.2f} |"
        )
    out += [
        "",
        "Frequency with which stripes_arrow's log predictive density beats the rival's on a test "
        "point (mean ± SE over the splits both ran; Lindinger Table 2 has it against mean-field at "
        "3 layers, 10 repetitions):",
        "",
        "| dataset | depth | steps | STAR | rival | splits | STAR beats rival | Lindinger (vs MF, "
        "3 layers) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (d, depth, steps, method), star in sorted(runs.items()):
        if not method.startswith("stripes_arrow"):
            continue
        protocol = _protocol_marks(star[0])
        for (d2, depth2, steps2, rival), rs in sorted(runs.items()):
            if (
                (d2, depth2, steps2) != (d, depth, steps)
                or rival.startswith("stripes_arrow")
                or _protocol_marks(rs[0]) != protocol
            ):
                continue
            by_split = {r["split"]: r for r in rs}
            freqs = [
                star_beats_frequency(r, by_split[r["split"]])
                for r in star
                if r["split"] in by_split
            ]
            if not freqs:
                continue
            m, se, n = mean_se(freqs)
            paper = LINDINGER_STAR_BEATS_MF.get(d) if rival.split(" (")[0] == "mean_field" else None
            out.append(
                f"| {d} | {depth} | {steps} | {method} | {rival} | {n} | {_fmt(m, se)} | "
                f"{_fmt(*paper) if paper else '—'} |"
            )
    out += [
        "",
        "Plot: `calibration.png` (observed against nominal coverage, pooled over splits).",
        "",
    ]
    return "\n".join(out)


def calibration_figure(records: List[Dict], title: str = "extrapolation"):
    """The figure of :func:`plot_calibration` (also the notebooks'): observed against nominal
    coverage, a panel per (dataset, step budget), a line per configuration in the family's colour,
    the depth's marker and a line style per variant of the family (``stripes_arrow (plain)``), one
    legend beside the panels. ``None`` without extrapolation lines."""
    import matplotlib.pyplot as plt

    from benchmarks import plot_style
    from deepgp_gi.metrics import calibration_curve

    runs = _extrapolation_runs(records)
    if not runs:
        return None
    datasets = sorted({d for d, _, _, _ in runs})
    budgets = sorted({steps for _, _, steps, _ in runs})
    methods = sorted({(method, depth) for _, depth, _, method in runs})
    # a variant (the marks after the family's name) has one line style in every family
    marks = sorted({method.partition(" ")[2] for method, _ in methods} - {""})
    style = {
        (method, depth): dict(
            color=plot_style.family_colour(method),
            marker=plot_style.depth_marker(depth),
            ls=plot_style.variant_linestyle(
                marks.index(method.partition(" ")[2]) + 1 if " " in method else 0
            ),
        )
        for method, depth in methods
    }
    fig, axes = plt.subplots(
        len(datasets),
        len(budgets),
        figsize=(4.2 * len(budgets), 3.8 * len(datasets)),
        squeeze=False,
    )
    for row, d in zip(axes, datasets):
        for ax, steps in zip(row, budgets):
            panel = sorted(
                ((method, depth), rs)
                for (d2, depth, s2, method), rs in runs.items()
                if (d2, s2) == (d, steps)
            )
            if not panel:
                ax.set_title(f"{d}, {steps} steps: not run", fontsize=9)
                ax.axis("off")
                continue
            for (method, depth), rs in panel:
                levels, observed = calibration_curve(
                    np.concatenate([np.asarray(r["test_pit"]) for r in rs])
                )
                ax.plot(
                    np.r_[0, levels],
                    np.r_[0, observed],
                    ms=3.5,
                    lw=1.4,
                    label=f"{method}-{depth} ({len(rs)} split{'s' if len(rs) > 1 else ''})",
                    **style[(method, depth)],
                )
            ax.plot([0, 1], [0, 1], color="0.5", ls=(0, (2, 2)), lw=1, label="calibrated")
            counts = sorted({len(rs) for _, rs in panel})
            splits = "-".join(str(c) for c in (counts[0], counts[-1]) if c) if counts else ""
            splits = str(counts[0]) if len(counts) == 1 else splits
            ax.set_title(f"{d}, {title}, {steps} steps\n(pooled over {splits} splits)", fontsize=9)
            ax.set_xlabel("nominal coverage of the central interval")
            ax.set_ylabel("observed coverage on test points")
            ax.set(xlim=(0, 1), ylim=(0, 1))
            ax.grid(alpha=0.3)
    handles = [
        plt.Line2D([], [], ms=5, label=f"{method}, depth {depth}", **style[(method, depth)])
        for method, depth in methods
    ] + [plt.Line2D([], [], color="0.5", ls=(0, (2, 2)), lw=1, label="calibrated (diagonal)")]
    fig.tight_layout()
    plot_style.legend_outside(fig, handles=handles, fontsize=9)
    return fig


def plot_calibration(records: List[Dict], path: str) -> bool:
    """Observed against nominal coverage of the central predictive intervals: one panel per
    (dataset, step budget) and in it one line per configuration (a row of the extrapolation table),
    so that a method run at two budgets is not listed twice in a panel; a configuration keeps its
    colour (its family's), marker (its depth's) and line style in every panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = calibration_figure(records)
    if fig is None:
        return False
    fig.suptitle(f"Regenerate: {REPORT_COMMAND}", fontsize=7, y=1.0)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


def cmd_report(args) -> int:
    files = sorted(f for f in os.listdir(args.results) if f.endswith(".jsonl"))
    all_records = [r for f in files for r in read_records(os.path.join(args.results, f))]
    if not all_records:
        print(f"no result lines under {args.results}", file=sys.stderr)
        return 1
    records = [r for r in all_records if r["protocol"] == "random"]
    tabled = [r for r in all_records if r["protocol"] in TABLE_PROTOCOLS]
    extrapolation = [r for r in all_records if r["protocol"] == "extrapolation"]
    reference = load_reference(args.reference)
    rows = summarise(tabled, reference)
    os.makedirs(args.out_dir, exist_ok=True)
    text = render_markdown(rows, len(tabled), files)
    text += render_latent_comparison(records)
    text += render_validation(records, published_from_reference(reference), REPORT_COMMAND)
    if extrapolation:
        text += render_extrapolation(extrapolation)
    with open(os.path.join(args.out_dir, "uci.md"), "w") as fh:
        fh.write(text)
    if not args.no_plots:
        plain = [s for s in rows if s.get("protocol", "random") == "random"]  # beside the papers'
        for metric, prefix, label in PLOTTED_METRICS:
            plot_metric(plain, metric, label, os.path.join(args.out_dir, prefix))
        plot_convergence(records, os.path.join(args.out_dir, "convergence.png"))
        if extrapolation:
            plot_calibration(extrapolation, os.path.join(args.out_dir, "calibration.png"))
    print(f"{len(records)} lines, {len(rows)} table rows -> {os.path.join(args.out_dir, 'uci.md')}")
    return 0


def _decay_label(cfg: Dict) -> str:
    decay = cfg.get("learning_rate_decay")
    return f" (lr {cfg['learning_rate']} x{decay[0]}/{decay[1]})" if decay else ""


def cmd_layers(args) -> int:
    import tensorflow as tf

    from deepgp_gi.uci_protocol import build_model, layer_variances_on_training_rows

    if not args.untrained and not args.checkpoint_dir:
        raise SystemExit("layers: give --checkpoint-dir (the sweep's) or --untrained")
    set_threads(args.threads)
    tasks = selected_tasks(args.sweep, args.only, args.dataset, args.posterior, args.depth)
    found = 0
    for group, cfg, split in tasks:
        if cfg["model"] != "gp":
            continue
        if args.untrained:
            latest, state = None, "untrained (the initialisation)"
        else:
            ckpt = _task_dir(args.checkpoint_dir, cfg, split)
            latest = tf.train.latest_checkpoint(ckpt) if os.path.isdir(ckpt) else None
            if latest is None:
                continue
            state = f"checkpoint at step {latest.rsplit('-', 1)[-1]} ({os.path.basename(ckpt)})"
        found += 1
        model, data = build_model(cfg, split)
        if latest is not None:
            tf.train.Checkpoint(model=model).restore(latest).expect_partial()
        rows, lv = layer_variances_on_training_rows(model, data, cfg, split)
        noise = getattr(model.likelihood, "variance", None)
        noise_text = (
            ""
            if noise is None
            else f"; likelihood variance {float(noise.numpy()):.4g} (normalised targets)"
        )
        first = " (layer 0: the latent coordinate)" if cfg.get("latent_dim") else ""
        lines = [
            f"{group}: {cfg['dataset']} {cfg['posterior']}-{cfg['depth']}{_decay_label(cfg)} split "
            f"{split}, {state}, first {rows} training rows, 16 joint samples{noise_text}{first}",
            "",
            "| layer | between-row variance of the mean | within-sample variance |",
            "|---|---|---|",
        ]
        lines += [
            f"| {l} | {b:.4g} | {w:.4g} |"
            for l, (b, w) in enumerate(zip(lv.between_rows, lv.within_samples))
        ]
        text = "\n".join(lines) + "\n"
        print(text)
        if args.out:
            with open(args.out, "a") as fh:
                fh.write(
                    "Command: `python "
                    f"{' '.join(shlex.quote(a) for a in [sys.argv[0]] + sys.argv[1:])}`\n\n{text}\n"
                )
    if not found:
        print(
            "no deep-GP task selected"
            if args.untrained
            else f"no deep-GP checkpoint of the selected tasks in {args.checkpoint_dir}"
        )
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks/uci.py", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser(
        "sweep", help="run a sweep file, appending one JSON line per (configuration, split)"
    )
    s.add_argument("sweep", help="TOML sweep file")
    s.add_argument(
        "--out",
        required=True,
        help="JSONL results file (appended; lines already there are skipped)",
    )
    s.add_argument(
        "--threads",
        type=int,
        default=None,
        help="TensorFlow intra- and inter-op threads (default: TF's)",
    )
    s.add_argument("--jobs", type=int, default=1, help="parallel worker processes (default 1)")
    s.add_argument(
        "--checkpoint-dir", default=None, help="checkpoint each task's training here (resumable)"
    )
    s.add_argument("--only", default=None, help="comma-separated group names to run")
    s.add_argument("--dataset", default=None, help="of those, only this data set's tasks")
    s.add_argument("--posterior", default=None, help="of those, only this family's tasks")
    s.add_argument("--depth", type=int, default=None, help="of those, only this depth's tasks")
    s.add_argument("--split", type=int, default=None, help="of those, only this split's tasks")
    s.add_argument("--dry-run", action="store_true", help="list the pending tasks and exit")
    s.set_defaults(func=cmd_sweep)
    r = sub.add_parser("report", help="markdown tables and PNG plots from the result lines")
    r.add_argument("--results", default=DEFAULT_RESULTS, help="folder of *.jsonl result files")
    r.add_argument("--out-dir", default=DEFAULT_RESULTS, help="where uci.md and the PNGs go")
    r.add_argument("--reference", default=REFERENCE_CSV, help="the papers' numbers (CSV)")
    r.add_argument("--no-plots", action="store_true", help="tables only")
    r.set_defaults(func=cmd_report)
    ly = sub.add_parser(
        "layers", help="per-layer variances of the runs whose checkpoints are in --checkpoint-dir"
    )
    ly.add_argument("sweep", help="TOML sweep file the runs belong to")
    ly.add_argument("--checkpoint-dir", default=None, help="the sweep's --checkpoint-dir")
    ly.add_argument(
        "--untrained",
        action="store_true",
        help="the selected tasks' models as initialised, no checkpoint",
    )
    ly.add_argument("--only", default=None, help="comma-separated group names")
    ly.add_argument("--dataset", default=None, help="only this data set")
    ly.add_argument("--posterior", default=None, help="only this family")
    ly.add_argument("--depth", type=int, default=None, help="only this depth")
    ly.add_argument("--threads", type=int, default=None, help="TensorFlow threads (default: TF's)")
    ly.add_argument("--out", default=None, help="markdown file to append the tables to")
    ly.set_defaults(func=cmd_layers)
    return p


def main(argv=None) -> int:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SelectionError as err:
        print(f"{args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
