"""The medium UCI sets (kin8nm, naval, power, protein): tables beside the published deep-GP numbers,
test LL against wall time, and the "which posterior to pick" decision table.

    python benchmarks/medium.py report [--results benchmarks/results/medium] \
        [--small benchmarks/results/uci] [--out-dir benchmarks/results/medium] [--no-plots]

The runs come from the sweep (``benchmarks/sweeps/medium.toml``, see its header for the protocol):

    python benchmarks/uci.py sweep benchmarks/sweeps/medium.toml \
        --out benchmarks/results/medium/medium.jsonl --threads 1

``report`` reads every ``*.jsonl`` under ``--results`` (the medium runs) and ``--small`` (the
small-set sweep), and writes ``medium.md`` (per data set: our rows beside O&A Table 10 with the
two-SE verdict, then every published deep-GP number in ``published.csv`` and the gap of our best row
to the best of them; our best row per data set against the best published one, and beside it the
configuration the validation data choose where a data set has lines trained with a validation split
(:func:`benchmarks.uci.choose_on_validation`; small sets too, against the papers' numbers in
``benchmarks/results/uci/paper_reference.csv``); the latent-variable rows against the plain family;
the sweep's groups still to run, with the runs they lack; the decision table over both sweeps) and
``test_ll_vs_time.png``. The medium rows' training times in the decision table and the figure are
the timed step of their family and depth (``benchmarks/speed.py --only medium_step --threads 1``,
read from ``--speed``) times their steps. The decision table and the best-against-published table
are also written to ``docs/choosing_a_posterior.md``; its short form, one row per data set
(:func:`readme_summary`), goes into the README, between its two generated-block marker lines.
Rows trained with a validation split (the model fitted 90 % of the training rows) are their own
rows in the tables, and stay out of the decision table and of the rows picked by their test LL.
"""

from __future__ import annotations

if not __package__:  # run by path: load benchmarks/ as the package (benchmarks/_by_path.py)
    import _by_path  # noqa: F401

import argparse
import csv
import math
import os
import sys
from collections import defaultdict
from typing import Dict, List, Optional

import numpy as np

from benchmarks import uci  # noqa: E402  (the sweep's reading and summarising)
from benchmarks.common import mean_se, read_lines, replace_between_markers  # noqa: E402
from deepgp_gi.families import DEEP_GP_FAMILIES  # noqa: E402
from deepgp_gi.uci_protocol import SAMPLER_COLLECT  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

MEDIUM = ("kin8nm", "power", "naval", "protein")
DEFAULT_RESULTS = os.path.join(HERE, "results", "medium")
DEFAULT_SMALL = os.path.join(HERE, "results", "uci")
SWEEP = os.path.join(HERE, "sweeps", "medium.toml")
PUBLISHED = os.path.join(DEFAULT_RESULTS, "published.csv")
DECISION_DOC = os.path.join(ROOT, "docs", "choosing_a_posterior.md")
GPU_LINES = os.path.join(HERE, "results", "gpu.jsonl")
SPEED_LINES = os.path.join(HERE, "results", "speed.jsonl")
#: benchmarks/speed.py's section of the medium sweep's steps timed at the sweep's settings (its
#: MEDIUM_STEP).
STEP_COST_SECTION = "medium_step"
COMMAND = "python benchmarks/medium.py report"
#: Wall-time budgets (training, on this 2-core machine, one TensorFlow thread) of the decision
#: table.
BUDGETS_S = (300.0, 600.0, 1800.0, math.inf)


def load_published(path: str = PUBLISHED) -> List[Dict]:
    with open(path) as fh:
        rows = list(csv.DictReader(r for r in fh if not r.startswith("#")))
    for r in rows:
        r["test_ll"] = float(r["test_ll"])
        r["se"] = float(r["se"]) if r["se"] else float("nan")
        r["depth"] = int(r["depth"]) if r["depth"] else None
    return rows


def with_reference_numbers(published: List[Dict], from_reference: List[Dict]) -> List[Dict]:
    """``published`` (the medium sets' ``published.csv``) with every number of the papers'
    reference table (:func:`benchmarks.uci.published_from_reference`: O&A, Lindinger, Rossi, on
    every set) that it does not already hold, matched by data set, source, method and depth. So the
    best published number of a medium set is taken over both tables (O&A's Table 10 included), and
    a small set's comes from the reference table."""

    def key(p: Dict) -> tuple:
        return p["dataset"], p["source"], p["method"], p["depth"]

    held = {key(p) for p in published}
    return published + [p for p in from_reference if key(p) not in held]


def _records(folder: str) -> List[Dict]:
    out = []
    if not os.path.isdir(folder):
        return out
    for name in sorted(os.listdir(folder)):
        if name.endswith(".jsonl"):
            out += uci.read_records(os.path.join(folder, name))
    return out


#: The medium sweep's minibatch (benchmarks/sweeps/medium.toml); a row trained at another is marked.
SWEEP_BATCH = 1000
#: The medium sweep's (the papers') step count; a medium row trained for another is its own family.
SWEEP_STEPS = 20000
#: The medium sweep's inducing points per layer; a medium row with another number is its own family.
SWEEP_NUM_INDUCING = 100


def _medium_other(s: Dict, key: str, sweep_value: int) -> Optional[int]:
    """The row's ``key`` where it is a medium-set row with another value than the sweep's."""
    value = s.get(key)
    return value if s.get("dataset") in MEDIUM and value and value != sweep_value else None


def _other_batch(s: Dict) -> Optional[int]:
    """The row's minibatch where it is a medium-set row trained at another than the sweep's."""
    return _medium_other(s, "batch_size", SWEEP_BATCH)


def _other_steps(s: Dict) -> Optional[int]:
    """The row's step count where it is a medium-set row trained for another than the sweep's."""
    return _medium_other(s, "steps", SWEEP_STEPS)


def _other_num_inducing(s: Dict) -> Optional[int]:
    """The row's inducing points per layer where they are another number than the sweeps' (the
    small and the medium sets' sweeps both default to :data:`SWEEP_NUM_INDUCING`)."""
    value = s.get("num_inducing")
    return value if value and value != SWEEP_NUM_INDUCING else None


def _other_samples(s: Dict) -> Optional[int]:
    """The row's training samples per step where they are not one (the sweeps' default)."""
    n = s.get("train_samples", 1)
    return n if n != 1 else None


def _family(s: Dict, with_schedule: bool = True) -> str:
    """The row's family as the decision table and the plot tell them apart: the posterior, a
    latent-variable model's latent width and K after it (``mean_field+w1K5``), the share of the
    training rows held out for validation (``global+valid0.1``), an objective other than the ELBO
    (``dspp+predictive``), a Student-t likelihood with its degrees of freedom (``sghmc+t4``), a
    sampling family's collection step where it is not the training step (``sghmc+collect0.03``),
    kernels started elsewhere than the builders' default (``sghmc+kstart-havasi``), a medium-set
    row's minibatch and inducing points where they are not the sweep's (``global+b10000``,
    ``sghmc+M128``), the training samples per step where they are not one (``global+s10``), and
    (``with_schedule``) the training schedule where it
    is not the sweep's: a decaying learning rate's factor (``global+decay0.9``: Adam's rate times
    0.9 every ``every`` steps) and a medium-set row's step count (``global+steps200000``)."""
    latent = (
        f"+w{s['latent_dim']}K{s.get('importance_samples') or 1}" if s.get("latent_dim") else ""
    )
    batch = f"+b{b}" if (b := _other_batch(s)) else ""
    inducing = f"+M{m}" if (m := _other_num_inducing(s)) else ""
    samples = f"+s{n}" if (n := _other_samples(s)) else ""
    decay = (
        f"+decay{s['learning_rate_decay'][0]:g}"
        if with_schedule and s.get("learning_rate_decay")
        else ""
    )
    steps = f"+steps{n}" if with_schedule and (n := _other_steps(s)) else ""
    valid = f"+valid{s['validation']:g}" if s.get("validation") else ""
    objective = f"+{s['objective']}" if s.get("objective") else ""
    student_t = f"+t{s['likelihood_df']:g}" if s.get("likelihood") == "student_t" else ""
    collect = f"+collect{s['collect_step_size']:g}" if s.get("collect_step_size") else ""
    floor = f"+floor{s['noise_floor']:.2g}" if s.get("noise_floor") else ""
    start = f"+noisestart{s['noise_start']:.2g}" if s.get("noise_start") else ""
    kernel_start = f"+kstart-{s['kernel_start']}" if s.get("kernel_start") else ""
    return (
        f"{s['posterior']}{latent}{batch}{inducing}{samples}{decay}{steps}{valid}{objective}"
        f"{student_t}{collect}{floor}{start}{kernel_start}"
    )


def _step_family(s: Dict) -> Optional[str]:
    """The family whose step the row trained with, as ``benchmarks/speed.py`` names it in its
    medium-step section: a decaying learning rate or another step count changes no step
    (``global+decay0.8`` and ``global+steps200000`` train with ``global``'s), another minibatch,
    number of inducing points or number of training samples does (None: not timed there)."""
    if _other_batch(s) or _other_num_inducing(s) or _other_samples(s):
        return None
    return _family(s, with_schedule=False)


def load_step_costs(lines: List[Dict]) -> Dict:
    """``{(family, depth): ms per step}`` from the speed lines of the medium sweep's steps (the last
    line of a depth wins)."""
    costs = {}
    for line in lines:
        if line.get("section") == STEP_COST_SECTION:
            for family, ms in line["ms_per_step"].items():
                costs[(family, line["config"]["depth"])] = float(ms)
    return costs


#: benchmarks/speed.py's section of the medium steps timed at the sweep's and the papers' minibatch.
MINIBATCH_COST_SECTION = "medium_minibatch"
#: How near its pair's final ELBO a run's training trace must come to count as there (nats per
#: point).
PASSES_TOLERANCE = 0.01
#: The share of a trace's logged points its running mean covers (the trace is a minibatch estimate).
TRACE_WINDOW = 0.05


def load_minibatch_costs(lines: List[Dict]) -> Dict:
    """``{(family, depth, minibatch): ms per step}`` from benchmarks/speed.py's minibatch
    section."""
    costs = {}
    for line in lines:
        if line.get("section") == MINIBATCH_COST_SECTION:
            c = line["config"]
            for name, ms in line["ms_per_step"].items():
                costs[(c["family"], c["depth"], int(name.split()[-1]))] = float(ms)
    return costs


def first_step_at(trace: Dict, target: float, window: float = TRACE_WINDOW) -> Optional[int]:
    """The first logged step at which the running mean of the training ELBO trace (over the last
    ``window`` share of its points) is at or above ``target``; None if it never is."""
    steps, elbo = trace["step"], np.asarray(trace["elbo_per_datapoint"], dtype=float)
    width = max(1, int(round(window * len(steps))))
    for i in range(width - 1, len(steps)):
        if elbo[i - width + 1 : i + 1].mean() >= target:
            return int(steps[i])
    return None


def same_passes(records: List[Dict], costs: Dict) -> List[str]:
    """Runs of one data set, family, depth and split that pass over the data as often by two
    routes, a larger minibatch or more steps (minibatch times steps equal, minibatches unequal):
    each run's test LL and ELBO, its training time at its timed step (``costs``, from
    :func:`load_minibatch_costs`; its recorded ms per step where that step was not timed), and how
    many passes and how long its training trace took to come within ``PASSES_TOLERANCE`` of the
    lower of the pair's final ELBOs."""
    plain = [
        r
        for r in records
        if r.get("model") == "gp"
        and r.get("protocol", "random") == "random"
        and not r.get("latent_dim")
        and not r.get("learning_rate_decay")
        and r.get("train_samples", 1) == 1
        and r.get("trace")
        and r["dataset"] in MEDIUM
    ]
    by_rows = defaultdict(list)
    for r in plain:
        by_rows[
            (
                r["dataset"],
                r["posterior"],
                r["depth"],
                r["split"],
                r["batch_size_used"] * r["steps"],
            )
        ].append(r)
    out = []
    for (dataset, posterior, depth, split, rows_read), runs in sorted(by_rows.items()):
        if len({r["batch_size_used"] for r in runs}) < 2:
            continue
        target = min(r["elbo_per_datapoint"] for r in runs) - PASSES_TOLERANCE
        for r in sorted(runs, key=lambda r: r["batch_size_used"]):
            ms = costs.get((posterior, depth, r["batch_size_used"]))
            timed = ms is not None
            ms = ms if timed else r["ms_per_step"]
            step = first_step_at(r["trace"], target)
            there = (
                f"{step * r['batch_size_used'] / r['n_train']:,.0f} | {ms * step / 60000:.0f} min"
                if step is not None
                else "— | —"
            )
            out.append(
                f"| {dataset} | {posterior}-{depth} | {split} | {r['batch_size_used']:,} | "
                f"{r['steps']:,} | {rows_read / r['n_train']:,.0f} | {r['test_ll']:.2f} | "
                f"{r['elbo_per_datapoint']:.3f} | {ms:.1f}{'' if timed else ' (recorded)'} | "
                f"{ms * r['steps'] / 60000:.0f} min | {there} |"
            )
    if not out:
        return []
    return (
        [
            "## The same passes over the data: a larger minibatch or more steps",
            "",
            "Runs that read as many rows (minibatch times steps) at two minibatches. ms/step: the "
            "step timed alone at that minibatch (`benchmarks/speed.py --only medium_minibatch "
            '--threads 1`; "recorded" where it was not timed); training time: that times the '
            "steps. The last two columns: the passes over the training set, and the time at the "
            "timed step, after which the running mean of the run's training ELBO trace (over "
            f"{TRACE_WINDOW:.0%} of its logged points) first came within {PASSES_TOLERANCE} nats "
            "per point of the lower of the two final ELBOs.",
            "",
            "| data set | family | split | minibatch | steps | passes | test LL | ELBO/N | ms/step "
            f"| training time | passes to ELBO − {PASSES_TOLERANCE} | time to it |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        + out
        + [""]
    )


def add_step_costs(rows: List[Dict], costs: Dict) -> List[Dict]:
    """Give each medium row the step cost the decision table and the plot use: the timed step of its
    family and depth (``costs``, from :func:`load_step_costs`) and the training time it implies
    (ms per step times the row's steps plus a sampling family's collection steps), with
    ``cost_timed`` True; a row whose step was not timed keeps its own recorded ms per step and wall
    time (``cost_timed`` False)."""
    for s in rows:
        ms = costs.get((_step_family(s), s["depth"])) if s["dataset"] in MEDIUM else None
        s["cost_timed"] = ms is not None
        s["cost_ms_per_step"] = ms if ms is not None else s["ms_per_step"]
        s["cost_time_s"] = (
            ms * (s["steps"] + s.get("collect_steps", 0)) / 1000.0
            if ms is not None
            else s["train_time_s"]
        )
    return rows


def _cost_time(s: Dict) -> float:
    return s.get("cost_time_s", s["train_time_s"])


def _cost_ms(s: Dict) -> float:
    return s.get("cost_ms_per_step", s["ms_per_step"])


def _label(s: Dict) -> str:
    family = _family(s)
    posterior, _, latent = family.partition("+")
    return f"{posterior}-{s['depth']}" + (f"+{latent}" if latent else "")


def _train_time(rows: List[Dict]) -> float:
    return float(np.median([r["train_time_s"] for r in uci.timing_runs(rows)]))


def summaries(records: List[Dict], reference: Dict) -> List[Dict]:
    """Deep-GP rows on the random splits, the bundled 90/10 ones and the seeded ones of
    :data:`benchmarks.uci.TABLE_PROTOCOLS` (uci.summarise; a row on a seeded protocol is its own,
    marked row), with the median training wall time."""
    records = [
        r
        for r in records
        if r.get("model") == "gp" and r.get("protocol", "random") in uci.TABLE_PROTOCOLS
    ]
    runs = uci.select_runs(records)
    out = uci.summarise(records, reference)
    for s, rows in zip(out, runs.values()):
        s["train_time_s"] = _train_time(rows)
        collected = [
            r["collected"] for r in rows if r.get("collected")
        ]  # a sampling family's sample set
        s["collect_steps"] = collected[0]["num_samples"] * collected[0]["thin"] if collected else 0
        s["label"] = _label(s)
    return out


def _fmt(pair, digits=2) -> str:
    m, se = pair
    return uci._fmt(m, se, digits)


def _paper(p) -> str:
    return f"{p[0]:.2f} ± {p[1]:.2f}" if p else "—"


def _method(s: Dict) -> str:
    """The row's family with its protocol where it differs from the sweep's usual one, e.g.
    ``mean_field (latent 1, K=5)``."""
    marks = (
        uci._protocol_marks(s)
        + ([f"batch {b:,}"] if (b := _other_batch(s)) else [])
        + ([f"M = {m}"] if (m := _other_num_inducing(s)) else [])
    )
    return f"{s['posterior']} ({', '.join(marks)})" if marks else s["posterior"]


_published_name = uci.published_name


def _best_published(
    dataset: str, published: List[Dict], protocol: Optional[str] = None
) -> Optional[Dict]:
    return uci.best_published(dataset, published, protocol)


#: The issue's minimum number of splits per row: the best-row table also names our best row among
#: these.
MIN_SPLITS = 3


def _our_best(
    dataset: str, rows: List[Dict], min_splits: int = 1, protocol: str = "random"
) -> Optional[Dict]:
    """Our row with the best mean test LL on ``dataset`` among those with ``min_splits`` splits or
    more, trained on the whole training splits of ``protocol`` (a row trained with a validation
    split is left out): the row picked on test data."""
    ours = [
        s
        for s in rows
        if s["dataset"] == dataset
        and len(s["splits"]) >= min_splits
        and not s.get("validation")
        and s.get("protocol", "random") == protocol
    ]
    return max(ours, key=lambda s: s["test_ll"][0]) if ours else None


def _gap(ours: Dict, best: Dict) -> str:
    return uci.gap_text(ours["test_ll"][0], best)


#: Splits over which the report averages the constant-Gaussian floor (those of the best rows).
BASELINE_SPLITS = (0, 1, 2, 3, 4)


def constant_baseline(dataset: str, splits=BASELINE_SPLITS) -> float:
    """The mean over ``splits`` of :func:`deepgp_gi.metrics.constant_gaussian_test_ll`: the test LL
    of one Gaussian fit to the training targets, which ignores the inputs (a collapsed fit's
    score)."""
    from deepgp_gi import datasets
    from deepgp_gi.metrics import constant_gaussian_test_ll

    values = []
    for split in splits:
        data = datasets.load_uci(dataset, split, protocol="random")
        values.append(constant_gaussian_test_ll(data.Y_train, data.Y_test, data.y_std))
    return float(np.mean(values))


def render_dataset(dataset: str, rows: List[Dict], published: List[Dict]) -> List[str]:
    lines = [f"### {dataset}", ""]
    ours = sorted(
        (s for s in rows if s["dataset"] == dataset), key=lambda s: (_method(s), s["depth"])
    )
    if not ours:
        lines += ["No finished runs yet.", ""]
    else:
        lines += [
            "| family | depth | splits | steps | batch | test LL | O&A Tab. 10 | within 2 SE | "
            "RMSE | ELBO/N | O&A ELBO/N | ms/step | train time |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for s in ours:
            paper_txt = _paper(s.get("paper_test_ll"))
            ok = s.get("ok_test_ll")
            verdict = (
                "—"
                if ok is None
                else (
                    "yes"
                    if ok
                    else ("no: above" if s["test_ll"][0] > s["paper_test_ll"][0] else "**no**")
                )
                + uci._one_split_mark(len(s["splits"]))
            )
            lines.append(
                f"| {_method(s)} | {s['depth']} | {len(s['splits'])} | {s['steps']:,} | "
                f"{s['batch_size'] or 'full'} | {_fmt(s['test_ll'])} | {paper_txt} | {verdict} | "
                f"{_fmt(s['rmse'], 3)} | {_fmt(s['elbo_per_datapoint'])} | "
                f"{_paper(s.get('paper_elbo_per_datapoint'))} | {s['ms_per_step']:.1f} | "
                f"{s['train_time_s'] / 60:.1f} min |"
            )
        lines.append("")
    pub = [p for p in published if p["dataset"] == dataset]
    if pub:
        best = _best_published(dataset, published)
        cells = ", ".join(f"{_published_name(p)} {p['test_ll']:.2f}" for p in pub)
        lines.append(f"Published deep-GP test LL ({dataset}): {cells}.")
        lines.append("")
        lines.append(
            "Floor: one Gaussian fit to the training targets, ignoring the inputs, scores "
            f"{constant_baseline(dataset):.2f} (mean over splits "
            f"{BASELINE_SPLITS[0]}-{BASELINE_SPLITS[-1]}; "
            "`deepgp_gi.metrics.constant_gaussian_test_ll`); a deep GP whose fit collapsed to the "
            "noise scores this."
        )
        lines.append("")
        top = _our_best(dataset, ours)
        if top is not None:
            gap = top["test_ll"][0] - best["test_ll"]
            lines.append(
                f"Best published: {_published_name(best)} {best['test_ll']:.2f} "
                f"({best['protocol']}); our best so far ({uci.PICKED_ON_TEST}): {top['label']} "
                f"{top['test_ll'][0]:.2f} ({'at or above' if gap >= 0 else f'{-gap:.2f} below'})."
            )
            lines.append("")
    return lines


#: The small sets, in the order the best-against-published table lists them (after the medium ones).
SMALL = ("boston", "concrete", "energy", "wine", "yacht")


def best_against_published(
    rows: List[Dict], published: List[Dict], records: List[Dict] = ()
) -> List[str]:
    """Per data set: our best row by mean test LL (``picked on test data``) beside the best
    published deep-GP number, and the gap between them, then the same for our best row with at least
    :data:`MIN_SPLITS` splits (a dash while there is none); and, where ``records`` hold lines
    trained with a validation split, the configuration the validation data choose
    (:func:`benchmarks.uci.choose_on_validation`, ``chosen on validation data``) with its test LL
    over all its splits and its gap to the best published number of the same protocol (the random
    90/10 splits). The medium sets always; a small set only where it has validation lines. A
    markdown table (:func:`validation_note` says how its rows were chosen)."""
    chosen = uci.choose_on_validation(records)
    refits = uci.refit_runs(records, chosen)
    candidates = uci.validation_candidates(records)
    k = uci.VALIDATION_SPLITS
    lines = [
        "| data set | how chosen | our row | its test LL | splits | best published deep GP | "
        f"protocol | gap | our best on {MIN_SPLITS}+ splits | its gap |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for dataset in MEDIUM + tuple(d for d in SMALL if d in candidates):
        top, best = _our_best(dataset, rows), _best_published(dataset, published)
        if top is not None and best is not None:
            firm = _our_best(dataset, rows, MIN_SPLITS)
            firm_cells = (
                f"{firm['label']} {_fmt(firm['test_ll'])} ({len(firm['splits'])}) | "
                f"{_gap(firm, best)}"
                if firm
                else "— | —"
            )
            lines.append(
                f"| {dataset} | {uci.PICKED_ON_TEST} | {top['label']} | {_fmt(top['test_ll'])} | "
                f"{len(top['splits'])} | {_published_name(best)} {best['test_ll']:.2f} | "
                f"{best['protocol']} | {_gap(top, best)} | {firm_cells} |"
            )
        if dataset not in candidates:
            continue
        how = f"{uci.CHOSEN_ON_VALIDATION} (splits 0-{k - 1})"
        c = chosen.get(dataset)
        if c is None:
            lines.append(f"| {dataset} | {how} | none eligible yet | — | — | — | — | — | — | — |")
            continue
        same = _best_published(dataset, published, uci.RANDOM_PROTOCOL)
        pub = (
            f"{_published_name(same)} {same['test_ll']:.2f} | {same['protocol']}"
            if same
            else "— | —"
        )
        lines.append(
            f"| {dataset} | {how} | {_label(c['config'])} | {_fmt(c['test_ll'])} | "
            f"{len(c['runs'])} | {pub} | {uci.gap_text(c['test_ll'][0], same)} | — | — |"
        )
        if dataset in refits:
            runs = refits[dataset]
            test_ll = mean_se(r["test_ll"] for r in runs)[:2]
            label = _label(dict(c["config"], validation=None))
            lines.append(
                f"| {dataset} | {how}, {uci.REFIT} | {label} | {_fmt(test_ll)} | {len(runs)} | "
                f"{pub} | {uci.gap_text(test_ll[0], same, se=test_ll[1])} | — | — |"
            )
    return lines


def same_protocol_table(rows: List[Dict], published: List[Dict]) -> List[str]:
    """Like for like: per data set and split protocol other than the bundled 90/10 splits
    (:data:`benchmarks.uci.PUBLISHED_PROTOCOL`, e.g. Rossi et al.'s 80/20), our best row on that
    protocol beside the best published number on it, and the gap. Empty while no row of ours was
    trained on such a protocol against a published number."""
    lines = []
    for dataset in MEDIUM + SMALL:
        for protocol, name in uci.PUBLISHED_PROTOCOL.items():
            if protocol == "random":
                continue
            ours = _our_best(dataset, rows, 1, protocol)
            best = _best_published(dataset, published, name)
            if ours is None or best is None:
                continue
            lines.append(
                f"| {dataset} | {name} | {ours['label']} | {_fmt(ours['test_ll'])} | "
                f"{len(ours['splits'])} | {_published_name(best)} {best['test_ll']:.2f} | "
                f"{uci.gap_text(ours['test_ll'][0], best, se=ours['test_ll'][1])} |"
            )
    if not lines:
        return []
    return [
        "| data set | protocol | our best row on it | test LL | splits | best published on it | "
        "gap |",
        "|---|---|---|---|---|---|---|",
    ] + lines


def readme_summary(rows: List[Dict], published: List[Dict], records: List[Dict] = ()) -> List[str]:
    """The README's short form of :func:`best_against_published`: one row per data set (the medium
    sets, then the small ones), the configuration the validation data choose where a set has one
    (its test LL over all its splits, its gap to the best published number on the random 90/10
    splits), otherwise our best row on :data:`MIN_SPLITS` or more splits picked by its test LL (its
    gap to the best published number of any protocol); a set with neither is left out. Then a line
    counting the sets at or above the published number and how their rows were chosen."""
    chosen = uci.choose_on_validation(records)
    refits = uci.refit_runs(records, chosen)
    lines = [
        "| data set | our row | how chosen | test LL | splits | best published deep GP | protocol "
        "| gap |",
        "|---|---|---|---|---|---|---|---|",
    ]
    counts = {"validation": 0, "test": 0, "ahead": 0}
    for dataset in MEDIUM + SMALL:
        c = chosen.get(dataset)
        if c is not None:
            best = _best_published(dataset, published, uci.RANDOM_PROTOCOL)
            label, test_ll, n = _label(c["config"]), c["test_ll"], len(c["runs"])
            how, kind = uci.CHOSEN_ON_VALIDATION, "validation"
            runs = refits.get(dataset, [])
            if len(runs) >= n:  # the choice as the papers train it, on as many splits
                label = _label(dict(c["config"], validation=None))
                test_ll, n = mean_se(r["test_ll"] for r in runs)[:2], len(runs)
                how = f"{uci.CHOSEN_ON_VALIDATION}, {uci.REFIT}"
        else:
            top = _our_best(dataset, rows, MIN_SPLITS)
            best = _best_published(dataset, published)
            if top is None:
                continue
            label, test_ll, n = top["label"], top["test_ll"], len(top["splits"])
            how, kind = uci.PICKED_ON_TEST, "test"
        counts[kind] += 1
        gap = uci.gap_text(test_ll[0], best, se=test_ll[1])
        counts["ahead"] += gap == "at or above"
        pub = (
            f"{_published_name(best)} {best['test_ll']:.2f} | {best['protocol']}"
            if best
            else "— | —"
        )
        lines.append(f"| {dataset} | {label} | {how} | {_fmt(test_ll)} | {n} | {pub} | {gap} |")
    total = counts["validation"] + counts["test"]
    lines += [
        "",
        f"At or above the best published number on {counts['ahead']} of {total} sets. "
        f"*{uci.CHOSEN_ON_VALIDATION}* ({counts['validation']} sets): the best mean validation LL "
        f"over splits 0-{uci.VALIDATION_SPLITS - 1} among configurations trained on 90 % of each "
        f"training split, scored on all its splits' test rows (*{uci.REFIT}*: retrained on whole "
        f"training splits, once on as many); *{uci.PICKED_ON_TEST}* "
        f"({counts['test']} sets): our best test LL on {MIN_SPLITS}+ splits. Gaps below also in "
        "SEs of the difference; the rule and both kinds of row: "
        "[docs/choosing_a_posterior.md](docs/choosing_a_posterior.md).",
    ]
    return lines


def validation_note(records: List[Dict]) -> str:
    """One line under the best-against-published table: how its two kinds of rows were chosen, and
    whether any data set has validation lines yet."""
    k = uci.VALIDATION_SPLITS
    return (
        f"*{uci.PICKED_ON_TEST}*: the row with the best mean test LL, which picked it; "
        f"*{uci.CHOSEN_ON_VALIDATION}*: among the configurations trained on 90 % of each training "
        f"split with a validation line on each of splits 0-{k - 1}, the best mean LL on the "
        "held-out 10 % (the rule: `docs/choosing_a_posterior.md`); its test LL is the mean over "
        "all its splits and its gap is to the best published number on the random 90/10 splits"
        + ("" if uci.validation_candidates(records) else "; no data set has validation lines yet")
        + "."
    )


def _size_class(s: Dict) -> str:
    return "medium (8k-46k rows)" if s["dataset"] in MEDIUM else "small (300-1,600 rows)"


def decision_table(rows: List[Dict]) -> List[str]:
    """For each data size, depth and training-time budget: the family with the best test LL (and
    with the best ELBO) on most data sets, among the rows that finished within the budget; a
    budget whose rows are those of the next larger one is left out. A medium row whose step was not
    timed (``cost_timed`` False: its time is the one recorded on whatever machine and load it ran)
    counts only without a budget. A row trained with a validation split (on 90 % of the training
    rows), on another protocol than the bundled 90/10 splits, or on fewer than :data:`MIN_SPLITS`
    splits (a mean over one or two splits set against means over ten picks the easier splits, not
    the better family) is not compared here."""
    groups = defaultdict(list)
    for s in rows:
        if s.get("validation") or s.get("protocol", "random") != "random":
            continue
        if len(s["splits"]) < MIN_SPLITS:
            continue
        groups[(_size_class(s), s["depth"])].append(s)
    lines = [
        "| data size | depth | training budget | best test LL (wins / data sets) | best ELBO (wins "
        "/ data sets) | their ms/step | families compared |",
        "|---|---|---|---|---|---|---|",
    ]
    for size, depth in sorted(groups, key=lambda k: (k[0], k[1])):
        cands = groups[(size, depth)]
        budgeted = [s for s in cands if s["dataset"] not in MEDIUM or s.get("cost_timed", True)]
        fits = [
            cands if math.isinf(budget) else [s for s in budgeted if _cost_time(s) <= budget]
            for budget in BUDGETS_S
        ]
        for i, (budget, fit) in enumerate(zip(BUDGETS_S, fits)):
            datasets = sorted({s["dataset"] for s in fit})
            # a budget holding the same rows as the next larger one says nothing the larger one does
            # not
            if not fit or (i + 1 < len(fits) and len(fits[i + 1]) == len(fit)):
                continue
            picks = {}
            for metric in ("test_ll", "elbo_per_datapoint"):
                wins = defaultdict(int)
                for d in datasets:  # a sampling family has no ELBO (NaN): it is not ranked on it,
                    # nor a row trained on the predictive objective (its ELBO is not what it
                    # maximised)
                    scored = [
                        s
                        for s in fit
                        if s["dataset"] == d
                        and np.isfinite(s[metric][0])
                        and not (metric != "test_ll" and s.get("objective") == "predictive")
                    ]
                    if scored:
                        wins[_family(max(scored, key=lambda s: s[metric][0]))] += 1
                if not wins:  # no row of this group has the metric (a sampling family's ELBO)
                    picks[metric] = ("—", 0)
                    continue
                # ties: the cheaper family (median ms per step)
                family = max(
                    wins,
                    key=lambda f: (
                        wins[f],
                        -np.median([_cost_ms(s) for s in fit if _family(s) == f]),
                    ),
                )
                picks[metric] = (family, wins[family])
            cost = []
            for family in {picks["test_ll"][0], picks["elbo_per_datapoint"][0]} - {"—"}:
                ms = [_cost_ms(s) for s in fit if _family(s) == family]
                cost.append(f"{family} {np.median(ms):.0f}")
            budget_txt = "any" if math.isinf(budget) else f"≤ {budget / 60:.0f} min"
            families = ", ".join(sorted({_family(s) for s in fit}))
            lines.append(
                f"| {size} | {depth} | {budget_txt} | {picks['test_ll'][0]} ({picks['test_ll'][1]} "
                f"/ {len(datasets)}) | {picks['elbo_per_datapoint'][0]} "
                f"({picks['elbo_per_datapoint'][1]} / {len(datasets)}) | {', '.join(sorted(cost))} "
                f"| {families} |"
            )
    return lines


#: How the figure names a row's setting that differs from the sweep's (a part of ``_family``).
_SETTING_TAGS = (
    (r"decay([\d.]+)", lambda m: f"lr x{m.group(1)}"),
    (r"b(\d+)", lambda m: f"batch {int(m.group(1)):,}"),
    (r"s(\d+)", lambda m: f"{m.group(1)} samples"),
    (r"steps(\d+)", lambda m: f"{int(m.group(1)):,} steps"),
    (r"M(\d+)", lambda m: f"M = {m.group(1)}"),
    (r"valid([\d.]+)", lambda m: f"{float(m.group(1)):.0%} validation"),
)


def setting_tag(family: str) -> str:
    """The settings a row's family label (``_family``) adds to its posterior, in words
    (``"global+decay0.8"`` -> ``"lr x0.8"``); a latent model's width and K are its family, not a
    setting ('')."""
    import re

    tags = []
    for part in family.split("+")[1:]:
        if re.fullmatch(r"w\d+K\d+", part):
            continue
        for pattern, text in _SETTING_TAGS:
            m = re.fullmatch(pattern, part)
            if m:
                tags.append(text(m))
                break
        else:
            tags.append(part)
    return ", ".join(tags)


def plot_time(rows: List[Dict], published: List[Dict], path: str) -> bool:
    """Test LL against training time, a panel per medium data set: one colour per family, one
    marker per depth, a mean over splits filled with its SE bar and a one-split row hollow; a row
    trained with a setting other than the sweep's is labelled with it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks import plot_style

    medium = [s for s in rows if s["dataset"] in MEDIUM and s.get("protocol", "random") == "random"]
    if not medium:
        return False
    fig, axes = plt.subplots(2, 2, figsize=(11, 8.6))
    families = plot_style.family_order(plot_style.base_family(_family(s)) for s in medium)
    labelled, drawn = {}, {}
    for ax, dataset in zip(axes.ravel(), MEDIUM):
        labelled[ax], drawn[ax] = [], []
        for s in (s for s in medium if s["dataset"] == dataset):
            m, se = s["test_ll"]
            x = _cost_time(s) / 60
            plot_style.errorbar_or_point(
                ax,
                x,
                m,
                se,
                len(s["splits"]),
                plot_style.family_colour(_family(s)),
                plot_style.depth_marker(s["depth"]),
            )
            bar = [m + k * se for k in (-1, -0.5, 0.5, 1)] if np.isfinite(se) else []
            drawn[ax] += [(x, m)] + [(x, v) for v in bar]
            tag = setting_tag(_family(s)) + ("" if s.get("cost_timed", True) else " *")
            if tag.strip():
                labelled[ax].append((x, m, tag.strip()))
        best = _best_published(dataset, published)
        title = dataset
        if best:  # the best published number as a dashed line, named in the title
            ax.axhline(best["test_ll"], color=plot_style.REFERENCE_COLOUR, ls="--", lw=1)
            title += (
                f"\n(dashed: best published, {_published_name(best)} "
                f"{best['test_ll']:.2f}, {best['protocol'].replace('random ', '')} splits)"
            )
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("training time (min, 1 thread): timed step x steps")
        ax.set_ylabel("test log-likelihood (nats per point)")
        ax.grid(alpha=0.3)
        ax.margins(x=0.12, y=0.1)
    handles = (
        [plot_style.heading_handle("family (colour)")]
        + plot_style.family_handles(families)
        + [plot_style.heading_handle("depth (marker)")]
        + plot_style.depth_handles(s["depth"] for s in medium)
        + [plot_style.heading_handle("row")]
        + plot_style.split_handles(
            multi=any(len(s["splits"]) > 1 for s in medium),
            single=any(len(s["splits"]) == 1 for s in medium),
        )
        + [
            plt.Line2D(
                [], [], color=plot_style.REFERENCE_COLOUR, ls="--", lw=1, label="best published"
            ),
            plot_style.heading_handle("text: setting other than\nthe sweep's"),
        ]
    )
    if not all(s.get("cost_timed", True) for s in medium):
        handles.append(plot_style.heading_handle("*: recorded wall time\n(step not timed)"))
    plot_style.legend_outside(fig, handles=handles, fontsize=9)
    fig.tight_layout(rect=(0, 0, 0.98, 1))
    for ax, points in labelled.items():
        plot_style.place_labels(ax, points, fontsize=7, avoid=drawn[ax])
    fig.savefig(
        path, dpi=110, bbox_inches="tight"
    )  # the legend beside the panels stays on the page
    plt.close(fig)
    return True


def cost_note(rows: List[Dict]) -> str:
    """A sentence on where the decision table's times and ms per step come from."""
    medium = [s for s in rows if s["dataset"] in MEDIUM]
    timed = [s for s in medium if s.get("cost_timed")]
    if not timed:
        return "Times: each row's recorded median training wall time and ms per step."
    untimed = sorted({_label(s) for s in medium if not s.get("cost_timed")})
    return (
        "Times of the medium rows: the step of the row's family and depth timed alone "
        f"(`benchmarks/speed.py --only {STEP_COST_SECTION} --threads 1`, kin8nm's inputs, "
        "`benchmarks/results/speed.md`) times the steps the row ran (a sampling family: plus its "
        "collection steps), not the row's recorded wall time, which depends on what ran beside it"
        + (
            f"; rows whose step was not timed ({', '.join(untimed)}) keep "
            "their recorded time and count only without a budget (that "
            "time is of whatever machine and load they ran on)"
            if untimed
            else ""
        )
        + ". Small sets: the recorded median wall time."
    )


def contention_note(rows: List[Dict]) -> str:
    """A sentence on how much the recorded step time of one and the same step (global inducing at
    depth 2, the sweep's minibatch: the learning rate's schedule does not change the step) varies
    between the medium rows, which ran beside a varying number of other sweeps; empty with fewer
    than two such rows."""
    same = [
        s["ms_per_step"]
        for s in rows
        if s["posterior"] == "global"
        and s["depth"] == 2
        and not s.get("latent_dim")
        and not _other_batch(s)
        and np.isfinite(s["ms_per_step"])
    ]
    if len(same) < 2:
        return ""
    return (
        " Why not the recorded times: the runs shared the two cores with one to three other "
        "sweeps, so those say as much about what ran beside them as about the family (the same "
        f"global-2 step is recorded at {min(same):.0f} to {max(same):.0f} ms)."
    )


def run_cost_s(cfg: Dict, costs: Dict) -> Optional[float]:
    """Seconds one sweep run of ``cfg`` takes at its family's timed step (``costs``, from
    :func:`load_step_costs`): the step times its steps, plus a sampling family's collection steps;
    None where that step was not timed (another minibatch, a family or depth not in the section)."""
    ms = costs.get((_step_family(cfg), cfg["depth"]))
    if ms is None:
        return None
    family = DEEP_GP_FAMILIES.get(cfg["posterior"])
    sampler = family is not None and getattr(family, "is_sampler", False)
    collect = SAMPLER_COLLECT["num_samples"] * SAMPLER_COLLECT["thin"] if sampler else 0
    return ms * (cfg["steps"] + collect) / 1000.0


def _hours(runs: List, costs: Dict) -> str:
    seconds = [run_cost_s(cfg, costs) for cfg, _ in runs]
    timed = [t for t in seconds if t is not None]
    if not timed:
        return ""
    untimed = len(seconds) - len(timed)
    extra = f", {untimed} run{'s' if untimed > 1 else ''} not timed" if untimed else ""
    return f" (about {sum(timed) / 3600:.1f} h of one core at the timed steps{extra})"


def groups_to_run(sweep: str, records: List[Dict], costs: Optional[Dict] = None) -> List[str]:
    """Markdown bullets: each group of ``sweep`` with runs still to do (how many of how many, which,
    and with ``costs`` -- :func:`load_step_costs` -- about how long they take at the timed steps),
    then the groups marked pending with their reason; or a line saying none remain."""
    lines, everything = [], []
    costs = costs or {}
    for name, n_done, todo in uci.group_progress(sweep, records):
        if todo:
            labels = ", ".join(
                f"{cfg['dataset']} {_label(cfg)} split {split}" for cfg, split in todo
            )
            lines.append(
                f"- `{name}`: {n_done} of {n_done + len(todo)} runs done{_hours(todo, costs)}; "
                f"to run: {labels}."
            )
            everything += todo
    for name, reason in uci.pending_groups(sweep):
        lines.append(f"- `{name}` (pending): {reason}.")
    total = _hours(everything, costs)
    if total:
        lines.append(
            f"\nIn all {len(everything)} runs{total}; the sweep runs one "
            "TensorFlow thread per process, so a machine with more cores runs as many processes "
            "side by side."
        )
    return lines or ["Every group of the sweep has run."]


def cmd_report(args) -> int:
    reference = uci.load_reference()
    published = load_published(os.path.join(args.results, "published.csv"))
    medium_records = _records(args.results)
    speed_lines = read_lines(args.speed) if args.speed else []
    costs = load_step_costs(speed_lines)
    rows = add_step_costs(summaries(medium_records, reference), costs)
    small_records = [r for r in _records(args.small) if r["dataset"] not in MEDIUM]
    small = summaries(small_records, reference)
    published_all = with_reference_numbers(published, uci.published_from_reference(reference))
    best_table = best_against_published(rows + small, published_all, medium_records + small_records)
    best_block = best_table + ["", validation_note(medium_records + small_records)]
    on_gpu = [r for r in medium_records if uci.record_device(r) != "CPU"]
    gpu_note = (
        f"{len(on_gpu)} runs trained on "
        f"{', '.join(sorted({uci.record_device(r).removeprefix('GPU: ') for r in on_gpu}))}: "
        + ", ".join(f"{r['dataset']} {_label(r)} split {r['split']}" for r in on_gpu)
        if on_gpu
        else "none so far"
    )
    lines = [
        "# Medium UCI sets: kin8nm, naval, power, protein",
        "",
        f"Generated by `{COMMAND}` from `benchmarks/results/medium/*.jsonl` (the sweep "
        "`python benchmarks/uci.py sweep benchmarks/sweeps/medium.toml --out "
        "benchmarks/results/medium/medium.jsonl --threads 1`). Protocol: the bundled random 90/10 "
        "splits, M = 100, Adam 0.01, one training sample, minibatch 1,000 (the papers: 10,000; see "
        "the sweep file for why), the papers' 20,000 steps unless a row says otherwise; test LL "
        "with 100 samples; ELBO/N estimated on the training set to SE 0.01. "
        '"Within 2 SE" compares the test LL with O&A\'s ("no: above": more than two SE above it; '
        '"*": one split of ours, judged against O&A\'s split-to-split spread, their SE times the '
        "square root of their split count). Times: one TensorFlow thread on a 2-core CPU shared "
        "with other work, so ms/step is an upper bound. Runs whose `commit` predates c534228 also "
        "carry about 8 ms per step of Python work in `fit`'s step call (the model's `dtype` "
        "property, read every step then; docs/performance.md). A run whose record names a GPU as "
        "its `device` (the same sweep command on a GPU machine, several runs sharing the GPU) "
        "counts in the row's test LL, RMSE and ELBO but not in its ms/step and train time, which "
        f"stay those of its CPU splits ({gpu_note}).",
        f"{len(medium_records)} finished runs.",
        "",
        "## Our rows beside the published numbers",
        "",
    ]
    for dataset in MEDIUM:
        lines += render_dataset(dataset, rows, published)
    lines += ["## Our best row against the best published number", ""] + best_block
    lines += [
        "",
        "Gap: our best mean test LL minus the best published deep-GP test LL on that data set (the "
        "published numbers average 5-20 splits; Rossi et al.'s BSGP uses 80/20 splits). The last "
        f"two columns do the same for our best row with at least {MIN_SPLITS} splits, the issue's "
        "minimum per row.",
        "",
    ]
    validation = uci.render_validation(
        [r for r in medium_records if r.get("protocol", "random") == "random"], published, COMMAND
    )
    if validation:
        lines += validation.strip("\n").splitlines() + [""]
    latent = uci.render_latent_comparison(medium_records, COMMAND)
    if latent:
        lines += latent.strip("\n").splitlines() + [""]
    lines += same_passes(medium_records, load_minibatch_costs(speed_lines))
    lines += ["## Groups still to run", ""] + groups_to_run(SWEEP, medium_records, costs)
    lines += ["", "## Which posterior to pick", ""]
    table = decision_table(rows + small)
    lines += table
    lines += [
        "",
        "Rows: for the data sets of that size and the depth, the family whose row has the best "
        "mean test LL (resp. ELBO) on most data sets, among the rows whose training time fits the "
        "budget (a budget that admits the same rows as the next larger one is left out); a tie "
        "goes to the cheaper family (median ms per step). Small sets: `benchmarks/results/uci` "
        "(5,000 full-batch steps); medium sets: this sweep. Groups of the sweep not yet run are "
        "missing from the comparison (see above). " + cost_note(rows),
        "",
    ]
    os.makedirs(args.out_dir, exist_ok=True)
    # the figure has a point per medium row: with none it is not drawn (nor named)
    if any(s["dataset"] in MEDIUM for s in rows):
        if not args.no_plots:
            plot_time(rows, published, os.path.join(args.out_dir, "test_ll_vs_time.png"))
        lines += ["![test LL against training time](test_ll_vs_time.png)", ""]
    with open(os.path.join(args.out_dir, "medium.md"), "w") as fh:
        fh.write("\n".join(lines))
    doc = (
        [
            "# Choosing a posterior",
            "",
            "Generated by `" + COMMAND + "` from the UCI result files "
            "(`benchmarks/results/uci/*.jsonl`, `benchmarks/results/medium/*.jsonl`); the full "
            "tables are in `benchmarks/results/medium/medium.md` and "
            "`benchmarks/results/uci/uci.md`.",
            "",
        ]
        + table
        + [
            "",
            "Budgets are training time on a 2-core CPU with one TensorFlow thread; a family "
            "missing from a row was not run there, or its run has not finished (`medium.md` lists "
            f"the groups still to run), or on fewer than {MIN_SPLITS} splits. "
            + cost_note(rows)
            + contention_note(rows),
            "",
        ]
    )
    doc += (
        [
            "## Chosen on validation data",
            "",
            "Which configuration a data set's validation data choose, beside the row picked by its "
            "own test LL and the best published numbers (the table of the README's results "
            "section):",
            "",
        ]
        + best_table
        + ["", uci.validation_rule_text(), ""]
    )
    same = same_protocol_table(rows + small, published_all)
    if same:
        doc += (
            [
                "## On the published number's own protocol",
                "",
                "Where the best published number was measured on other splits than the bundled "
                "random 90/10 ones (Rossi et al.'s 80/20), our best row trained on those splits, "
                "beside it:",
                "",
            ]
            + same
            + [""]
        )
    doc += gpu_cost_table(read_lines(args.gpu) if args.gpu else [])
    with open(args.decision_doc, "w") as fh:
        fh.write("\n".join(doc))
    if args.readme:  # the README carries the summary; the decision table lives in the decision doc
        summary = readme_summary(rows + small, published_all, medium_records + small_records)
        replace_between_markers(args.readme, "\n".join(summary), BEST_MARKERS)
    print(
        f"wrote {os.path.join(args.out_dir, 'medium.md')} and {args.decision_doc} ({len(rows)} "
        "medium rows)"
    )
    return 0


#: benchmarks/gpu.py's name for GPflux's DSVI rows (its ``GPFLUX``).
GPFLUX = "gpflux DSVI"


def gpu_cost_table(lines: List[Dict]) -> List[str]:
    """What each family's plain float64 training step costs on a GPU, from ``benchmarks/gpu.py``'s
    lines: ms per step and the ratio to GPflux's DSVI step of the same run and batch size."""
    plain = [
        l
        for l in lines
        if l.get("mode") == "plain" and l.get("ms_per_step") and l["config"]["dtype"] == "float64"
    ]
    if not plain:
        return []
    gpflux = {l["config"]["batch"]: l["ms_per_step"] for l in plain if l["family"] == GPFLUX}
    batches = sorted(b for b in {l["config"]["batch"] for l in plain} if b in gpflux)
    families = list(dict.fromkeys(l["family"] for l in plain if l["family"] != GPFLUX))
    configs = sorted({(l["config"]["depth"], l["config"]["M"]) for l in plain})
    out = [
        "## Step cost on a GPU",
        "",
        f"From `benchmarks/results/gpu.md` ({'; '.join(sorted({l['device'] for l in plain}))}; "
        f"depth and M: {', '.join(f'{d} and {m}' for d, m in configs)}; plain float64 step): ms "
        "per step, and in brackets the ratio to GPflux's DSVI step in the same run. On a GPU the "
        "step is bound by kernel launches up to batch 10,000, so these ratios, not the CPU's, are "
        "what a GPU user pays.",
        "",
        "| family | " + " | ".join(f"batch {b:,}" for b in batches) + " |",
        "|---|" + "---|" * len(batches),
    ]
    for family in families + [GPFLUX]:
        cells = []
        for b in batches:
            ms = [
                l["ms_per_step"]
                for l in plain
                if l["config"]["batch"] == b and l["family"] == family
            ]
            cells.append(f"{ms[0]:.1f} ({ms[0] / gpflux[b]:.2f})" if ms else "—")
        out.append(f"| {family} | " + " | ".join(cells) + " |")
    return out + [""]


#: The README's generated block (:func:`readme_summary`): the report replaces what lies between
#: these two lines.
BEST_MARKERS = (
    "<!-- best against published: generated by `python benchmarks/medium.py report` -->",
    "<!-- end of the generated best-against-published table -->",
)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report")
    rep.add_argument("--results", default=DEFAULT_RESULTS)
    rep.add_argument("--small", default=DEFAULT_SMALL)
    rep.add_argument("--out-dir", default=DEFAULT_RESULTS)
    rep.add_argument("--decision-doc", default=DECISION_DOC)
    rep.add_argument(
        "--speed",
        default=SPEED_LINES,
        help="benchmarks/speed.py's result lines, for the timed steps of section "
        f"{STEP_COST_SECTION} ('' to budget with the recorded wall times)",
    )
    rep.add_argument(
        "--gpu", default=GPU_LINES, help="benchmarks/gpu.py's result lines ('' to leave them out)"
    )
    rep.add_argument(
        "--readme",
        default=os.path.join(ROOT, "README.md"),
        help="the README whose generated best-against-published block is rewritten ('' to skip)",
    )
    rep.add_argument(
        "--no-plots", action="store_true", help="tables only (test_ll_vs_time.png is left as it is)"
    )
    rep.set_defaults(func=cmd_report)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
