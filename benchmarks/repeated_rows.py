"""Test rows that repeat a training row exactly, and what the models score on them.

    python benchmarks/repeated_rows.py [--out benchmarks/results/uci/repeated_rows.md]

Some UCI sets record the same row more than once (wine's red wines, concrete's mixtures). A test
row whose inputs and target both equal a row the model was fitted to is one the model has seen: a
model that follows its training targets closely scores it well, whatever it does elsewhere. This
report measures how much of each set's test LL sits on such rows:

* per data set, over its standard random splits 0-9 (0-4 for protein), the test rows whose inputs
  repeat a fitted row and those whose inputs and target both do, with all the split's training
  rows fitted and with the 90 % a validation line fits (:func:`deepgp_gi.datasets.load_uci` with
  ``validation=0.1``);
* per result line that records each test point's log density (``test_ll_points``, under
  ``benchmarks/results/uci/``, its ``pointwise/`` folder and ``benchmarks/results/medium/``), the
  mean log density over the repeated rows (inputs and target) and over the others.

Rows are compared exactly, after the split's own standardisation (the same affine map for the
fitted and the test rows, so equal raw rows stay equal).
"""

from __future__ import annotations

if not __package__:  # run by path: load benchmarks/ as the package (benchmarks/_by_path.py)
    import _by_path  # noqa: F401  (imported for its side effect)

import argparse
import glob
import os
from collections import defaultdict
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from benchmarks.common import mean_se, read_lines

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
DEFAULT_OUT = os.path.join(RESULTS, "uci", "repeated_rows.md")
COMMAND = "python benchmarks/repeated_rows.py"
#: The result files searched for lines with ``test_ll_points`` (relative to ``RESULTS``).
RESULT_GLOBS = ("uci/*.jsonl", "uci/pointwise/*.jsonl", "medium/*.jsonl")
#: The split protocols whose test rows are a random share of the data set (not the extrapolation
#: protocol's upper half).
RANDOM_PROTOCOLS = ("random", "random_80_20", "random_75_15_10")
#: Splits counted per data set (fewer where a set has fewer).
COUNTED_SPLITS = 10
#: The validation share of the validation lines (``load_uci(..., validation=...)``).
VALIDATION_SHARE = 0.1


def repeated_test_rows(
    X_fit: np.ndarray, Y_fit: np.ndarray, X_test: np.ndarray, Y_test: np.ndarray
) -> Tuple[np.ndarray, np.ndarray]:
    """Which test rows repeat a fitted row exactly.

    :param X_fit: the fitted rows' inputs [N, D]; ``Y_fit`` their targets [N, 1].
    :param X_test: the test rows' inputs [T, D]; ``Y_test`` their targets [T, 1].
    :returns: ``(same_inputs, same_row)``, boolean [T] each: the test row's inputs equal some
        fitted row's inputs; its inputs and its target equal one fitted row's.
    :raises ValueError: the arrays are not 2-D, their row counts or widths disagree.
    """
    arrays = dict(X_fit=X_fit, Y_fit=Y_fit, X_test=X_test, Y_test=Y_test)
    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()}
    for k, v in arrays.items():
        if v.ndim != 2:
            raise ValueError(f"{k} must be 2-D, got shape {v.shape}")
    for x, y in (("X_fit", "Y_fit"), ("X_test", "Y_test")):
        if arrays[x].shape[0] != arrays[y].shape[0]:
            raise ValueError(f"{x} and {y} have {arrays[x].shape[0]} and {arrays[y].shape[0]} rows")
    for a, b in (("X_fit", "X_test"), ("Y_fit", "Y_test")):
        if arrays[a].shape[1] != arrays[b].shape[1]:
            raise ValueError(
                f"{a} and {b} have {arrays[a].shape[1]} and {arrays[b].shape[1]} columns"
            )
    fitted_inputs = {row.tobytes() for row in arrays["X_fit"] + 0.0}  # + 0.0: -0.0 becomes 0.0
    fitted_rows = {row.tobytes() for row in np.hstack([arrays["X_fit"], arrays["Y_fit"]]) + 0.0}
    same_inputs = np.array([row.tobytes() in fitted_inputs for row in arrays["X_test"] + 0.0])
    test_rows = np.hstack([arrays["X_test"], arrays["Y_test"]]) + 0.0
    same_row = np.array([row.tobytes() in fitted_rows for row in test_rows])
    return same_inputs.astype(bool), same_row.astype(bool)


def split_repeats(name: str, split: int, protocol: str = "random", validation=None) -> Dict:
    """The repeated test rows of one split: ``n_test``, ``same_inputs`` and ``same_row`` (boolean
    [T] masks of :func:`repeated_test_rows`), fitted rows = the split's training rows (those left
    after the ``validation`` share is held out); with ``validation``, ``valid_same_row`` too
    (boolean [V]: the validation rows that repeat a fitted row, inputs and target)."""
    from deepgp_gi.datasets import load_uci

    data = load_uci(name, split, protocol=protocol, validation=validation)
    same_inputs, same_row = repeated_test_rows(data.X_train, data.Y_train, data.X_test, data.Y_test)
    out = dict(n_test=len(same_row), same_inputs=same_inputs, same_row=same_row)
    if validation:
        out["valid_same_row"] = repeated_test_rows(
            data.X_train, data.Y_train, data.X_valid, data.Y_valid
        )[1]
    return out


def count_rows(names: Sequence[str], splits: int = COUNTED_SPLITS) -> List[Dict]:
    """Per data set: the mean over its first ``splits`` random splits of the test rows, those whose
    inputs repeat a training row and those whose inputs and target do (all training rows fitted,
    and the 90 % of a validation line), and the validation rows (10 %) that repeat a row of that
    90 %."""
    from deepgp_gi.datasets import load_uci_raw

    rows = []
    for name in names:
        n = min(splits, load_uci_raw(name)[2])
        whole = [split_repeats(name, s) for s in range(n)]
        held = [split_repeats(name, s, validation=VALIDATION_SHARE) for s in range(n)]
        rows.append(
            dict(
                dataset=name,
                splits=n,
                n_test=float(np.mean([w["n_test"] for w in whole])),
                same_inputs=float(np.mean([w["same_inputs"].sum() for w in whole])),
                same_row=float(np.mean([w["same_row"].sum() for w in whole])),
                same_row_valid=float(np.mean([h["same_row"].sum() for h in held])),
                n_valid=float(np.mean([len(h["valid_same_row"]) for h in held])),
                valid_same_row=float(np.mean([h["valid_same_row"].sum() for h in held])),
            )
        )
    return rows


def line_label(r: Dict) -> str:
    """A result line's configuration, e.g. ``sghmc-3 (validation 10%, M = 128)``."""
    from benchmarks.uci import _protocol_marks
    from deepgp_gi.uci_protocol import DEFAULTS

    marks = _protocol_marks(r)
    if r.get("num_inducing") not in (None, DEFAULTS["num_inducing"]):
        marks.append(f"M = {r['num_inducing']}")
    depth = f"-{r['depth']}" if r.get("depth") else ""
    return f"{r['posterior']}{depth}" + (f" ({', '.join(marks)})" if marks else "")


def split_points(r: Dict, repeats: Optional[Dict] = None) -> Dict:
    """A result line's test log densities split by :func:`repeated_test_rows` (inputs and target)
    against the rows it was fitted to: ``n`` test points, ``n_same`` repeated ones, the mean log
    density over all, the repeated and the other points (``nan`` where a part is empty).

    :raises ValueError: the line's points do not match its split's test rows in number."""
    if repeats is None:
        repeats = split_repeats(
            r["dataset"], r["split"], r.get("protocol", "random"), r.get("validation") or None
        )
    points = np.asarray(r["test_ll_points"], dtype=np.float64)
    same = repeats["same_row"]
    if points.shape != same.shape:
        raise ValueError(
            f"the line of {r['dataset']} split {r['split']} has {points.size} test points; the "
            f"split has {same.size} test rows"
        )

    def mean(v):
        return float(v.mean()) if v.size else float("nan")

    return dict(
        n=int(points.size),
        n_same=int(same.sum()),
        all=mean(points),
        same=mean(points[same]),
        other=mean(points[~same]),
    )


def pointwise_lines(results: str = RESULTS, datasets=None) -> List[Tuple[str, Dict]]:
    """``(file relative to results, line)`` for every result line with ``test_ll_points`` on a
    random split protocol (:data:`RANDOM_PROTOCOLS`), of ``datasets`` if given."""
    found = []
    for pattern in RESULT_GLOBS:
        for path in sorted(glob.glob(os.path.join(results, pattern))):
            for r in read_lines(path):
                if (
                    r.get("test_ll_points")
                    and r.get("protocol", "random") in RANDOM_PROTOCOLS
                    and (datasets is None or r["dataset"] in datasets)
                ):
                    found.append((os.path.relpath(path, results), r))
    return found


def _f(v: float) -> str:
    return "–" if np.isnan(v) else f"{v:.2f}"


def render(counts: List[Dict], lines: List[Tuple[str, Dict]], command: str = COMMAND) -> str:
    """The report's markdown from :func:`count_rows` and :func:`pointwise_lines`."""
    out = [
        "# Test rows that repeat a training row",
        "",
        f"Generated by `{command}` from the bundled splits and the committed result lines "
        "(`benchmarks/repeated_rows.py` says how rows are matched).",
        "",
        "## How many",
        "",
        "Mean per split over each set's first random 90/10 splits: test rows whose inputs equal a "
        "training row's, and whose inputs and target both equal one training row's; then the "
        "same with the 90 % of the training rows a validation line fits, and the validation rows "
        "(the other 10 %) that repeat a row of that 90 %, as the rule choosing on validation data "
        "sees them.",
        "",
        "| data set | splits | test rows | same inputs | same inputs and target | "
        "same inputs and target, 90 % fitted | validation rows | validation rows repeating |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in counts:
        out.append(
            f"| {c['dataset']} | {c['splits']} | {c['n_test']:.0f} | {c['same_inputs']:.1f} | "
            f"{c['same_row']:.1f} ({c['same_row'] / c['n_test']:.0%}) | {c['same_row_valid']:.1f} "
            f"| {c['n_valid']:.0f} | {c['valid_same_row']:.1f} "
            f"({c['valid_same_row'] / c['n_valid']:.0%}) |"
        )
    out += [
        "",
        "## What the models score there",
        "",
        "Per result line that records each test point's log density (original units), on the "
        "sets above with repeated test rows: the mean "
        "over all test points (from the line's own points, so it may differ from its test LL in "
        "the second decimal), over the test rows that repeat a row the line's model was fitted to "
        "(inputs and target), and over the other rows.",
        "",
        "| data set | split | configuration | steps | file | test points | repeated | all | "
        "repeated rows | other rows |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    by_key: Dict[Tuple, List] = defaultdict(list)
    for path, r in lines:
        by_key[(r["dataset"], line_label(r))].append((path, r, split_points(r)))
    for dataset, label in sorted(by_key):
        for path, r, p in sorted(by_key[(dataset, label)], key=lambda t: t[1]["split"]):
            out.append(
                f"| {dataset} | {r['split']} | {label} | {r.get('steps', '')} | {path} | {p['n']} "
                f"| {p['n_same']} | {_f(p['all'])} | {_f(p['same'])} | {_f(p['other'])} |"
            )
    summary = _summary({k: [p for _, _, p in v] for k, v in by_key.items()})
    if summary:
        out += ["", "Over the splits of each configuration above (mean ± SE over its splits):", ""]
        out += ["| data set | configuration | splits | repeated rows | other rows |"]
        out += ["|---|---|---|---|---|"]
        out += summary
    return "\n".join(out) + "\n"


def _summary(groups: Dict[Tuple, List[Dict]]) -> List[str]:
    """Rows of mean ± SE over splits of :func:`split_points` by ``(data set, configuration)``."""
    rows = []
    for (dataset, label), parts in sorted(groups.items()):
        if len(parts) < 2:
            continue
        cells = []
        for key in ("same", "other"):
            m, se, n = mean_se(p[key] for p in parts if not np.isnan(p[key]))
            cells.append("–" if n == 0 else f"{m:.2f}" + (f" ± {se:.2f}" if n > 1 else ""))
        rows.append(f"| {dataset} | {label} | {len(parts)} | {cells[0]} | {cells[1]} |")
    return rows


def report_text(names: Sequence[str]) -> str:
    """The report on data sets ``names``: :func:`count_rows`, then the lines with test points of
    the sets among them that have repeated test rows."""
    counts = count_rows(names)
    repeated = {c["dataset"] for c in counts if c["same_row"] > 0}
    return render(counts, pointwise_lines(datasets=repeated))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=DEFAULT_OUT, help="the markdown report to write")
    p.add_argument(
        "--datasets", default=None, help="comma-separated data sets to count (default: all nine)"
    )
    return p


def main(argv=None) -> int:
    from deepgp_gi.datasets import UCI_NAMES

    args = build_parser().parse_args(argv)
    text = report_text(args.datasets.split(",") if args.datasets else list(UCI_NAMES))
    with open(args.out, "w", encoding="utf-8") as fh:
        fh.write(text)
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
