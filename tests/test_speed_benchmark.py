"""benchmarks/speed.py: the step it times for a family is the step ``fit`` trains that
family with."""

import numpy as np
import pytest
import tensorflow as tf

import deepgp_gi as dg
from benchmarks import medium, speed


def data(n=12, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 2)), rng.normal(size=(n, 1))


def test_sampling_families_come_from_the_family_table():
    rows = speed.sampling_and_latent_families()
    sampling = [
        name
        for name, family in dg.families.DEEP_GP_FAMILIES.items()
        if getattr(family, "is_sampler", False)
    ]
    assert "sghmc" in sampling
    assert [label for label, _, options in rows if not options] == sampling
    assert all(name in dg.families.DEEP_GP_FAMILIES for _, name, _ in rows)


@pytest.mark.slow  # two fits and two timed steps, about 10 s each: `make test-all`
@pytest.mark.parametrize("posterior", ["mean_field", "sghmc"])
def test_fit_step_repeats_fit(posterior):
    """Three calls of fit_step give the values fit logs for its first three full-batch steps
    (seed 0, one sample): the same step class, variables, optimiser and noise stream."""
    X, Y = data()

    def build():
        return dg.build_deep_gp(
            X, Y, depth=2, posterior=posterior, num_inducing=4, inner_width=2, seed=0
        )

    step = speed.fit_step(build(), X, Y)
    timed = [float(step()) for _ in range(3)]
    history = dg.fit(build(), (X, Y), steps=3, seed=0, progress=False, log_every=1)
    np.testing.assert_allclose(timed, history.elbo, rtol=1e-10)
    step.raise_if_failed()


def test_paired_ratio_of_steps_with_known_times(monkeypatch):
    """Two 'steps' that advance a fake clock by 2 ms and 6 ms per call, except that round 3
    (B first) runs under a load that triples both: the medians are 2 and 6 ms, every paired
    ratio is 3."""
    clock = {"now": 0.0, "load": 1.0, "calls": 0}
    monkeypatch.setattr(speed.time, "perf_counter", lambda: clock["now"])

    def ticking(ms):
        def step():
            clock["calls"] += 1
            clock["now"] += ms * 1e-3 * clock["load"]
            return tf.constant(0.0)

        return lambda: step

    # rounds start after 3 warm-up calls of each step; 2 steps per side per round
    def loaded_round():
        calls = clock["calls"] - 6
        clock["load"] = 3.0 if 3 * 4 <= calls < 4 * 4 else 1.0

    def step_a():
        loaded_round()
        return ticking(2.0)()()

    def step_b():
        loaded_round()
        return ticking(6.0)()()

    result = speed.paired_ratio(lambda: step_a, lambda: step_b, rounds=6, steps_per_round=2)
    assert result["median_ms_a"] == pytest.approx(2.0) and result["median_ms_b"] == pytest.approx(
        6.0
    )
    assert result["median_paired_ratio"] == pytest.approx(3.0) and result[
        "ratio_of_medians"
    ] == pytest.approx(3.0)
    assert result["paired_ratio_quartiles"] == pytest.approx([3.0, 3.0])


def test_star_pairs_are_written_to_the_results_table(monkeypatch, tmp_path):
    """``--star-pairs`` keeps its paired ratios in speed.jsonl (replacing the previous run's, other
    sections untouched) and speed.md shows them with their command."""
    monkeypatch.setattr(speed, "RESULTS", str(tmp_path))
    other = {
        "section": "bnn",
        "config": {"batch": 1000},
        "ms_per_step": {"x": 1.0},
        "rounds": 1,
        "steps_per_round": 1,
        "commit": "c",
        "command": "python benchmarks/speed.py --only bnn",
        "machine": "m",
    }
    import json

    (tmp_path / "speed.jsonl").write_text(
        json.dumps(other) + "\n" + json.dumps(dict(other, section="star_pairs")) + "\n"
    )

    def fake_pairs(specs, rounds, per):
        return [
            dict(
                pair="stripes_arrow / mean_field",
                batch=1000,
                depth=3,
                M=100,
                inner_width=8,
                rounds=rounds,
                steps_per_round=per,
                load_average=0.5,
                median_ms_a=30.0,
                median_ms_b=57.0,
                ratio_of_medians=1.9,
                median_paired_ratio=1.93,
                paired_ratio_quartiles=[1.9, 1.97],
            )
        ]

    monkeypatch.setattr(speed, "star_pairs", fake_pairs)
    speed.main(["--star-pairs", "1000:100:8", "--rounds", "5", "--steps-per-round", "2"])
    lines = [json.loads(l) for l in (tmp_path / "speed.jsonl").read_text().splitlines()]
    assert [l["section"] for l in lines] == ["bnn", "star_pairs"]
    assert lines[1]["config"] == {"batch": 1000, "depth": 3, "M": 100, "inner_width": 8}
    md = (tmp_path / "speed.md").read_text()
    assert "| 1000 | 100 | 8 | 30.0 | 57.0 | 1.90 | 1.93 | 1.90 to 1.97 |" in md
    assert "--star-pairs 1000:100:8 --rounds 5 --steps-per-round 2" in md


def test_the_medium_step_section_times_every_step_the_medium_sweep_trains():
    """Every (family, depth) of benchmarks/sweeps/medium.toml at the sweep's minibatch has a timed
    step in the section the decision table budgets with, named as benchmarks/medium.py names it
    (a decaying learning rate trains with its family's step); nothing else is timed there."""
    wanted = {
        (medium._step_family(cfg), cfg["depth"])
        for name, cfg, _ in medium.uci.load_sweep(medium.SWEEP)
        if medium._step_family(cfg) is not None
    }
    X, Y = data()
    timed = {
        (family, depth) for depth in (2, 3, 5) for family in speed.medium_sweep_steps(X, Y, depth)
    }
    assert wanted and wanted == timed
    assert speed.MEDIUM_STEP == medium.STEP_COST_SECTION


def test_the_minibatch_section_times_every_medium_row_at_another_minibatch_beside_the_sweeps(
    monkeypatch, tmp_path
):
    """The medium sweep's rows at another minibatch (the `medium-*-batch10000` groups) have their
    family and depth timed at that minibatch and at the sweep's, and speed.md gives the price of a
    pass over the data at each: a step at 10,000 rows against ten at 1,000."""
    sweep = [cfg for _, cfg, _ in medium.uci.load_sweep(medium.SWEEP) if medium._other_batch(cfg)]
    timed = [
        (config, makers)
        for section, config, makers in speed.sections(quick=True)
        if section == speed.MEDIUM_MINIBATCH
    ]
    assert sweep and {(cfg["posterior"], cfg["depth"]) for cfg in sweep} == {
        (c["family"], c["depth"]) for c, _ in timed
    }
    assert {cfg["batch_size"] for cfg in sweep} | {medium.SWEEP_BATCH} == set(speed.MEDIUM_BATCHES)
    assert all(set(makers) == {f"batch {b}" for b in speed.MEDIUM_BATCHES} for _, makers in timed)

    line = dict(
        section=speed.MEDIUM_MINIBATCH,
        config=dict(family="global", depth=2, M=100),
        ms_per_step={"batch 1000": 25.0, "batch 10000": 200.0},
        rounds=7,
        steps_per_round=10,
        commit="c",
        command="python benchmarks/speed.py --only medium_minibatch --threads 1",
        machine="m",
        threads=1,
    )
    md = speed.write_markdown([line], str(tmp_path / "speed.md"))
    assert (tmp_path / "speed.md").read_text() == md
    assert "| global-2 | 25.0 | 200.0 | 8.0 | 0.80 |" in md and "one TensorFlow thread" in md


@pytest.mark.slow  # builds and times MNIST-sized models
def test_the_mnist_section_times_the_mnist_benchmarks_models(monkeypatch, tmp_path):
    """`--only mnist` times fit's step of every deep GP benchmarks/mnist_dgp.py trains (family and
    depth) and of every LeNet BNN family benchmarks/images.py trains on MNIST, on random data of
    MNIST's shape; its lines go to the given files with the command, the other sections' lines
    kept, and speed.md has a row per model with steps and seconds per epoch. Run at a tiny size
    (minibatches of 40 and 20 images, M = 5, one round of one step); the full size is checked
    without timing it."""
    import json
    import math

    from benchmarks import mnist_dgp

    full = [(c, set(m)) for s, c, m in speed.sections(quick=True) if s == speed.MNIST]
    dgps = {"mean_field-1", "mean_field-2", "mean_field-3", "global-2", "global-3"}
    bnns = {"factorised", "global", "ffg_u", "ensemble_u", "ensemble_w"}
    assert full == [
        (dict(model="deep GP", batch=10_000, M=100), dgps),
        (dict(model="LeNet BNN", prior="neal", batch=500, M=100), bnns),
    ]
    assert dgps == {f"{f}-{d}" for f, depths in mnist_dgp.DEPTHS.items() for d in depths}
    X, Y = speed.mnist_inputs(50)
    assert X.shape == (50, 28, 28, 1) and X.min() >= 0 and X.max() <= 1
    assert Y.shape == (50, 1) and set(np.unique(Y)) <= set(range(10))

    monkeypatch.setattr(speed, "MNIST_DGP_BATCH", 40)  # PCA to the inner width 30 needs N >= 30
    monkeypatch.setattr(speed, "MNIST_BNN_BATCH", 20)
    monkeypatch.setattr(speed, "MNIST_NUM_INDUCING", 5)
    jsonl, md = tmp_path / "s.jsonl", tmp_path / "s.md"
    other = dict(
        section="bnn",
        config={"batch": 1000},
        ms_per_step={"x": 1.0},
        rounds=1,
        steps_per_round=1,
        commit="c",
        command="python benchmarks/speed.py --only bnn",
        machine="m",
    )
    jsonl.write_text(json.dumps(other) + "\n" + json.dumps(dict(other, section="mnist")) + "\n")
    argv = ["--only", "mnist", "--rounds", "1", "--steps-per-round", "1"]
    speed.main(argv + ["--jsonl", str(jsonl), "--md", str(md)])
    lines = [json.loads(l) for l in jsonl.read_text().splitlines()]
    assert lines[0] == other and [l["section"] for l in lines[1:]] == ["mnist", "mnist"]
    assert [(l["config"], set(l["ms_per_step"])) for l in lines[1:]] == [
        (dict(model="deep GP", batch=40, M=5), dgps),
        (dict(model="LeNet BNN", prior="neal", batch=20, M=5), bnns),
    ]
    for l in lines[1:]:
        assert all(math.isfinite(ms) and ms > 0 for ms in l["ms_per_step"].values())
        assert l["command"].startswith("python benchmarks/speed.py " + " ".join(argv))
    text = md.read_text()
    rows = [r for r in text.splitlines() if r.startswith("| deep GP") or r.startswith("| LeNet")]
    assert len(rows) == 10 and "| deep GP | global | 3 | 40 | 5 |" in text
    assert "| LeNet BNN (neal prior) | ffg_u | LeNet | 20 | 5 |" in text
    assert all(r.split(" | ")[6] == "1,500" for r in rows[:5])  # 60,000 / 40
    assert all(r.split(" | ")[6] == "3,000" for r in rows[5:])  # 60,000 / 20
