"""The committed result tables regenerate byte for byte from the committed result lines.

Every table under ``benchmarks/results/`` that its script writes from result lines alone, without
training, is rendered again (into a temporary folder, or as text) by the script's own report code
and compared with the committed file. Figures are not drawn.
"""

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _assert_regenerates(committed: Path, text: str) -> None:
    assert text == committed.read_text(encoding="utf-8"), (
        f"{committed.relative_to(ROOT)} differs from what its report writes from the committed "
        "lines"
    )


def test_uci_table(tmp_path, capsys):
    from benchmarks import uci

    assert (
        uci.main(
            ["report", "--results", str(RESULTS / "uci"), "--out-dir", str(tmp_path), "--no-plots"]
        )
        == 0
    )
    _assert_regenerates(
        RESULTS / "uci" / "uci.md", (tmp_path / "uci.md").read_text(encoding="utf-8")
    )


def test_medium_tables_the_decision_table_and_the_readme_blocks(tmp_path, capsys):
    from benchmarks import medium

    readme = tmp_path / "README.md"
    shutil.copy(ROOT / "README.md", readme)
    decision = tmp_path / "choosing_a_posterior.md"
    assert (
        medium.main(
            [
                "report",
                "--out-dir",
                str(tmp_path),
                "--decision-doc",
                str(decision),
                "--readme",
                str(readme),
                "--no-plots",
            ]
        )
        == 0
    )
    _assert_regenerates(
        RESULTS / "medium" / "medium.md", (tmp_path / "medium.md").read_text(encoding="utf-8")
    )
    _assert_regenerates(
        ROOT / "docs" / "choosing_a_posterior.md", decision.read_text(encoding="utf-8")
    )
    _assert_regenerates(ROOT / "README.md", readme.read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    "name, plot", [("mnist", True), ("digits", False), ("digits_inducing_weights", False)]
)
def test_image_tables(name, plot):
    from benchmarks import images
    from benchmarks.common import read_lines

    folder = "benchmarks/results/images"
    results = f"{folder}/{name}.jsonl"
    text = images.render_report(
        read_lines(str(ROOT / results)),
        results,
        f"{folder}/{name}.md",
        f"{folder}/{name}.png" if plot else None,
    )
    _assert_regenerates(RESULTS / "images" / f"{name}.md", text)


def test_large_table():
    from benchmarks import large
    from benchmarks.common import read_lines

    text = large.render_report(
        read_lines(str(RESULTS / "large.jsonl")), large.ceiling_info(500), "large.png"
    )
    _assert_regenerates(RESULTS / "large.md", text)


def test_gpu_and_speed_tables(tmp_path):
    from benchmarks import gpu, speed
    from benchmarks.common import read_lines

    gpu.write_markdown(read_lines(str(RESULTS / "gpu.jsonl")), str(tmp_path / "gpu.md"))
    _assert_regenerates(RESULTS / "gpu.md", (tmp_path / "gpu.md").read_text(encoding="utf-8"))
    text = speed.write_markdown(
        read_lines(str(RESULTS / "speed.jsonl")), str(tmp_path / "speed.md")
    )
    _assert_regenerates(RESULTS / "speed.md", text)


def test_gi_convergence_star_and_gap_regression_tables(tmp_path, capsys):
    from benchmarks import gap_regression, gi_convergence, star_offdiagonal, star_warmup
    from benchmarks.common import read_lines

    assert gi_convergence.main(["report", "--out", str(tmp_path / "gi.md")]) == 0
    _assert_regenerates(
        RESULTS / "gi_convergence.md", (tmp_path / "gi.md").read_text(encoding="utf-8")
    )

    star_warmup.write_md(
        read_lines(str(RESULTS / "star_warmup.jsonl")), str(tmp_path / "warmup.md")
    )
    _assert_regenerates(
        RESULTS / "star_warmup.md", (tmp_path / "warmup.md").read_text(encoding="utf-8")
    )

    # the lines do not record the command; the table names the one that wrote it
    command = (
        "python benchmarks/star_offdiagonal.py "
        "--variants mean_field,plain,preconditioned,plain_stripes,plain_arrow"
    )
    star_offdiagonal.write_md(
        read_lines(str(RESULTS / "star_offdiagonal.jsonl")), str(tmp_path / "star.md"), command
    )
    _assert_regenerates(
        RESULTS / "star_offdiagonal.md", (tmp_path / "star.md").read_text(encoding="utf-8")
    )

    rows = read_lines(str(RESULTS / "gap_regression.jsonl"))
    config = rows[-1]["config"]
    done = {r["method"]: r for r in rows if r["config"] == config}
    noise_variance = gap_regression.make_data(config["seed"])[2]["noise_variance"]
    gap_regression.write_markdown(
        [done[m] for m in gap_regression.METHODS if m in done],
        config,
        rows[-1]["command"],
        noise_variance,
        tmp_path / "gap.md",
    )
    _assert_regenerates(
        RESULTS / "gap_regression.md", (tmp_path / "gap.md").read_text(encoding="utf-8")
    )


def test_inducing_weights_tables():
    from benchmarks import inducing_weights as iw
    from benchmarks.common import read_lines

    for name, report in (
        ("inducing_weights_digits", lambda rows, md, command: iw.digits_report(rows, md, command)),
        (
            "inducing_weights_toy_settings",
            lambda rows, md, command: iw.toy_settings_report(rows, command),
        ),
    ):
        md = RESULTS / f"{name}.md"
        rows = read_lines(str(RESULTS / f"{name}.jsonl"))
        # the table lists the commands of its lines and the one that rewrote it: here
        # the last line's
        text = iw.with_notes(report(rows, md, rows[-1]["command"]), md.read_text(encoding="utf-8"))
        _assert_regenerates(md, text)


def test_no_committed_result_names_a_folder_of_the_machine_that_wrote_it():
    """Every text file under benchmarks/results/ reads the same through ``portable``: its commands
    and messages name paths relative to the checkout, ``CKPT_DIR``, ``TMP_DIR/...`` or ``~``."""
    from benchmarks.common import portable

    files = [
        p
        for p in RESULTS.rglob("*")
        if p.is_file()
        and p.suffix in (".md", ".jsonl", ".csv", ".txt")
        and "checkpoints" not in p.parts
    ]
    assert files
    named = [
        str(p.relative_to(ROOT))
        for p in files
        if portable(p.read_text(encoding="utf-8")) != p.read_text(encoding="utf-8")
    ]
    assert named == []


def test_portable_paths():
    from benchmarks.common import portable

    assert portable(
        "python /a/b/benchmarks/uci.py sweep --checkpoint-dir /scratch/run1 --out "
        "/a/b/benchmarks/results/uci/uci.jsonl"
    ) == (
        "python benchmarks/uci.py sweep --checkpoint-dir CKPT_DIR --out "
        "benchmarks/results/uci/uci.jsonl"
    )
    assert (
        portable("(defined @ /x/deepgp_gi/training/step.py:74)")
        == "(defined @ deepgp_gi/training/step.py:74)"
    )
    assert portable("--out /tmp/ab.md and /var/tmp/my-ckpt/3") == "--out TMP_DIR/ab.md and CKPT_DIR"
    text = "ms/step, ELBO/N, 1/2, https://example.org/a, benchmarks/x.md, /path/to/commit, ~/data"
    assert portable(text) == text


def test_repeated_rows_report():
    from benchmarks import repeated_rows as rr
    from deepgp_gi.datasets import UCI_NAMES

    _assert_regenerates(RESULTS / "uci" / "repeated_rows.md", rr.report_text(list(UCI_NAMES)))


def test_predictive_noise_table():
    from benchmarks import predictive_noise
    from benchmarks.common import read_lines

    _assert_regenerates(
        RESULTS / "predictive_noise.md",
        predictive_noise.report(read_lines(str(RESULTS / "predictive_noise.jsonl"))),
    )
