"""benchmarks/uci.py: a sweep and a report end to end on one tiny configuration, and the report's
arithmetic on synthetic lines."""

import json
import math
import os
import re

import numpy as np
import pytest

from benchmarks import uci

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


TINY = """
[defaults]
num_inducing = 8
test_samples = 100
[[group]]
name = "tiny"
model = "gp"
datasets = ["yacht"]
posteriors = ["mean_field"]
depths = [2]
steps = 20
splits = [0]
"""

SCHEMA = {
    "model",
    "dataset",
    "posterior",
    "depth",
    "prior",
    "hidden",
    "num_inducing",
    "steps",
    "batch_size",
    "learning_rate",
    "train_samples",
    "test_samples",
    "seed",
    "split",
    "seed_used",
    "commit",
    "group",
    "command",
    "train_time_s",
    "ms_per_step",
    "elbo_per_datapoint",
    "elbo_se_per_datapoint",
    "elbo_samples",
    "test_ll",
    "rmse",
    "trace",
}


@pytest.mark.slow  # trains one configuration end to end: `make test-all`
def test_sweep_and_report_end_to_end(tmp_path, capsys):
    sweep = tmp_path / "tiny.toml"
    sweep.write_text(TINY)
    out = tmp_path / "res" / "uci.jsonl"
    argv = [
        "sweep",
        str(sweep),
        "--out",
        str(out),
        "--threads",
        "1",
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
    ]
    assert uci.main(argv) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 1
    r = lines[0]
    assert SCHEMA <= set(r), SCHEMA - set(r)
    assert (r["dataset"], r["model"], r["posterior"], r["depth"], r["steps"], r["split"]) == (
        "yacht",
        "gp",
        "mean_field",
        2,
        20,
        0,
    )
    assert (
        r["test_samples"] == 100
        and r["num_inducing"] == 8
        and r["batch_size_used"] == r["n_train"] == 277
    )
    assert r["elbo_se_per_datapoint"] < 0.01
    assert all(
        math.isfinite(r[k]) for k in ("test_ll", "rmse", "elbo_per_datapoint", "ms_per_step")
    )
    assert r["rmse"] > 0 and r["trace"]["step"][-1] == 20
    assert (
        len(r["trace"]["step"]) == len(r["trace"]["elbo_per_datapoint"]) == 2
    )  # logged every 10 steps
    assert not os.listdir(tmp_path / "ckpt")  # a finished task's checkpoint is removed
    # a second run finds the line and appends nothing
    capsys.readouterr()
    assert uci.main(argv) == 0
    assert "1 already in" in capsys.readouterr().out
    assert len(out.read_text().splitlines()) == 1
    # report: tables and plots from the real line
    assert (
        uci.main(["report", "--results", str(out.parent), "--out-dir", str(tmp_path / "rep")]) == 0
    )
    md = (tmp_path / "rep" / "uci.md").read_text()
    assert uci.REPORT_COMMAND in md
    assert (
        f"| yacht | mean_field | 2 | 8 | 20 | 1 | {r['test_ll']:.2f} (1 split) | -0.40 ± 0.03 |"
        in md
    )
    # the one-split verdict uses the paper's spread 0.03 * sqrt(20)
    ok = abs(r["test_ll"] + 0.40) <= 2 * math.sqrt(0.03**2 * 20 + 0.03**2)
    assert f"| -0.40 ± 0.03 | {'yes*' if ok else '**no***'} |" in md
    for png in ("test_ll_yacht.png", "elbo_yacht.png"):  # one figure per data set
        assert (tmp_path / "rep" / png).stat().st_size > 1000


def _line(split, lr, ll, elbo, rmse, dataset="boston", posterior="global", steps=100, **extra):
    return (
        dict(
            model="gp",
            dataset=dataset,
            posterior=posterior,
            depth=2,
            prior=None,
            hidden=None,
            num_inducing=100,
            steps=steps,
            batch_size=None,
            learning_rate=lr,
            train_samples=1,
            test_samples=100,
            seed=0,
            positive_transform="exp" if posterior in ("global", "local") else "softplus",
            protocol="random",
            last_layer="marginal" if posterior == "global" else None,
            split=split,
            test_ll=ll,
            rmse=rmse,
            elbo_per_datapoint=elbo,
            elbo_se_per_datapoint=0.005,
            ms_per_step=10.0,
            commit="abc1234",
            trace={
                "step": [10, 20, 30, 40, 50],
                "elbo_per_datapoint": [-3.0, -1.0, -0.2, -0.15, -0.1],
            },
        )
        | extra
    )


def test_report_mean_se_against_hand_computation(tmp_path):
    ll = [-2.31, -2.52, -2.47, -2.38]
    elbo = [-0.31, -0.27, -0.35, -0.29]
    rmse = [2.7, 3.1, 2.9, 2.6]
    lines = [_line(k, 0.01, ll[k], elbo[k], rmse[k]) for k in range(4)]
    # split 1 again at another learning rate with a worse ELBO: selection by ELBO must ignore it
    lines.append(_line(1, 0.003, 5.0, -9.0, 0.1))
    # split 2 at another learning rate with a better ELBO: it replaces the lr=0.01 line of split 2
    lines.append(_line(2, 0.003, -2.60, -0.20, 3.3))
    used_ll = [ll[0], ll[1], -2.60, ll[3]]
    res = tmp_path / "res"
    res.mkdir()
    (res / "synthetic.jsonl").write_text(
        "".join(json.dumps(x) + "\n" for x in lines) + '{"truncated": '
    )
    ref = tmp_path / "ref.csv"
    ref.write_text(
        "# comment\nmodel,dataset,posterior,depth,prior,metric,mean,se,source\n"
        "gp,boston,global,2,,test_ll,-2.42,0.05,test\n"
        "gp,boston,global,2,,elbo_per_datapoint,0.50,0.01,test\n"
    )
    assert (
        uci.main(
            [
                "report",
                "--results",
                str(res),
                "--out-dir",
                str(tmp_path / "rep"),
                "--reference",
                str(ref),
                "--no-plots",
            ]
        )
        == 0
    )
    md = (tmp_path / "rep" / "uci.md").read_text()

    mean = sum(used_ll) / 4
    se = math.sqrt(sum((v - mean) ** 2 for v in used_ll) / 3) / 2  # sample SD (n - 1) over sqrt(n)
    assert (round(mean, 2), round(se, 2)) == (-2.45, 0.07)
    row = f"| boston | global | 2 | 100 | 100 | 4 | {mean:.2f} ± {se:.2f} | -2.42 ± 0.05 | yes |"
    assert row in md, md
    used_elbo = [elbo[0], elbo[1], -0.20, elbo[3]]
    m_e = np.mean(used_elbo)
    s_e = np.std(used_elbo, ddof=1) / 2
    assert f"| {m_e:.2f} ± {s_e:.2f} | 0.50 ± 0.01 | **no** |" in md
    # no reference number for RMSE: a dash, not a verdict
    assert re.search(
        r"\| boston \| global \| 2 \| 100 \| 100 \| 4 \| 2\.\d\d ± 0\.\d\d \| — \| — \|", md
    )
    # steps to 99% of the improvement from -3.0 to -0.1: threshold -0.129, first reached at step 50
    # and within 0.05 of the final -0.1 (>= -0.15) first at step 40
    assert "| boston | global | 2 | 100 | 4 | 50 | 40 |" in md


def test_a_latent_variable_row_is_not_compared_with_the_plain_models_paper_number():
    """The papers' numbers are for the plain families: a latent row of the same family and depth
    gets a dash, not a verdict, while the plain row beside it keeps its comparison."""
    reference = {("gp", "boston", "global", 2, None): {"test_ll": (-2.42, 0.05, "test", 20)}}
    plain = [_line(k, 0.01, -2.40, -0.3, 3.0) for k in range(2)]
    latent = [
        _line(k, 0.01, -2.30, -0.3, 3.0, latent_dim=1, importance_samples=5) for k in range(2)
    ]
    rows = {bool(s["latent_dim"]): s for s in uci.summarise(plain + latent, reference)}
    assert (
        rows[False]["paper_test_ll"] == (-2.42, 0.05, "test", 20)
        and rows[False]["ok_test_ll"] is True
    )
    assert rows[True]["paper_test_ll"] is None and rows[True]["ok_test_ll"] is None
    # nor is a row trained on the predictive objective (its ELBO is not what it maximised)
    predictive = [_line(k, 0.01, -2.30, -9.0, 3.0, objective="predictive") for k in range(2)]
    (row,) = uci.summarise(_records(predictive), reference)
    assert row["paper_test_ll"] is None and row["ok_elbo_per_datapoint"] is None


def test_a_decaying_learning_rate_is_its_own_row_not_a_learning_rate_choice():
    """Lines at the same rate, one constant and one decayed, are two rows (the ELBO choice between
    learning rates must not swallow the constant run); the decayed row is marked."""
    constant = [_line(k, 0.01, 6.7, 2.3, 0.001, dataset="naval") for k in range(2)]
    decayed = [
        _line(k, 0.01, 8.3, 3.9, 0.001, dataset="naval", learning_rate_decay=[0.9, 1000])
        for k in range(2)
    ]
    rows = {json.dumps(s["learning_rate_decay"]): s for s in uci.summarise(constant + decayed, {})}
    assert set(rows) == {"null", "[0.9, 1000]"}
    assert rows["null"]["test_ll"][0] == pytest.approx(6.7) and rows["[0.9, 1000]"]["test_ll"][
        0
    ] == pytest.approx(8.3)
    assert (
        uci._protocol_marks(rows["[0.9, 1000]"]) == ["lr 0.01 x0.9/1000"]
        and uci._protocol_marks(rows["null"]) == []
    )


def test_mean_se_and_two_se_rule():
    m, se, n = uci.mean_se([1.0, 2.0, 4.0])
    assert (
        n == 3
        and m == pytest.approx(7 / 3)
        and se == pytest.approx(np.std([1, 2, 4], ddof=1) / math.sqrt(3))
    )
    assert math.isnan(uci.mean_se([1.0])[1])
    assert uci.within_two_se(-2.41, 0.03, -2.50, 0.04) is True  # 0.09 <= 2 * 0.05
    assert uci.within_two_se(-2.39, 0.03, -2.50, 0.04) is False
    # one split: our SE is the paper's split-to-split SD, 0.05 * sqrt(20) = 0.2236;
    # 2 * sqrt(0.2236^2 + 0.05^2) = 0.458
    assert uci.within_two_se(-2.05, float("nan"), -2.50, 0.05, 20) is True
    assert uci.within_two_se(-2.03, float("nan"), -2.50, 0.05, 20) is False
    assert uci.within_two_se(-2.49, float("nan"), -2.50, 0.05) is None
    # a printed SE of 0.00 counts as 0.005: 2 * sqrt(0.01^2 + 0.005^2) = 0.0224
    assert uci.within_two_se(1.50, 0.01, 1.48, 0.0) is True
    assert uci.within_two_se(1.51, 0.01, 1.48, 0.0) is False


def test_sweep_file_order_and_validation(tmp_path):
    tasks = uci.load_sweep(os.path.join(ROOT, "benchmarks", "sweeps", "uci.toml"))
    first = [t for t in tasks if t[0] == "dgp-d2-split0"]
    assert (
        len(first) == 10 and tasks[:10] == first
    )  # split 0 of every deep-GP (dataset, family) first
    assert {(c["dataset"], c["posterior"]) for _, c, _ in first} == {
        (d, p)
        for d in ("boston", "concrete", "energy", "wine", "yacht")
        for p in ("mean_field", "global")
    }
    keys = [(uci.config_key(c), s) for _, c, s in tasks]
    assert len(keys) == len(set(keys))
    bad = tmp_path / "bad.toml"
    bad.write_text('[[group]]\nname = "x"\ndatasets = ["yacht"]\nsplits = [0]\nstepz = 3\n')
    with pytest.raises(ValueError, match="unknown keys"):
        uci.load_sweep(str(bad))


def test_lines_written_before_a_config_key_existed(tmp_path):
    """A line without ``positive_transform``/``protocol`` was trained with softplus on the random
    splits: it matches a softplus configuration, not the exp default of global inducing, and the
    report shows it as its own row, marked."""
    old = _line(0, 0.01, -2.4, -0.4, 3.0)
    del old["positive_transform"], old["protocol"]
    mf = _line(0, 0.01, -2.5, -0.5, 3.1, posterior="mean_field")
    del mf["positive_transform"], mf["protocol"]
    new = _line(0, 0.01, -2.3, -0.3, 2.9)
    res = tmp_path / "res"
    res.mkdir()
    path = res / "lines.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in (old, mf)))
    done = uci.done_set(str(path))
    cfg = {k: old[k] for k in uci.CONFIG_KEYS if k in old}
    assert (uci.config_key(uci.normalise_config(cfg)), 0) not in done  # global now defaults to exp
    assert (
        uci.config_key(uci.normalise_config(dict(cfg, positive_transform="softplus"))),
        0,
    ) in done
    mf_cfg = {k: mf[k] for k in uci.CONFIG_KEYS if k in mf}
    assert (
        uci.config_key(uci.normalise_config(mf_cfg)),
        0,
    ) in done  # mean-field's default is softplus
    path.write_text("".join(json.dumps(x) + "\n" for x in (old, mf, new)))
    assert (
        uci.main(
            ["report", "--results", str(res), "--out-dir", str(tmp_path / "rep"), "--no-plots"]
        )
        == 0
    )
    md = (tmp_path / "rep" / "uci.md").read_text()
    assert "| boston | global (softplus) | 2 | 100 | 100 | 1 | -2.40 (1 split) |" in md
    assert "| boston | global | 2 | 100 | 100 | 1 | -2.30 (1 split) |" in md
    assert "| boston | mean_field | 2 | 100 | 100 | 1 | -2.50 (1 split) |" in md
    # the global-vs-mean-field comparison uses the current default (exp), not the old row
    assert "| boston | 2 | 100 | 1 | -0.50 (1 split) | -0.30 (1 split) | yes |" in md


@pytest.mark.parametrize(
    "posterior, key, default, legacy, other",
    [
        ("stripes_arrow", "offdiagonal", "preconditioned", "plain", "mean_field"),
        ("global", "last_layer", "marginal", "sampled", "local"),
    ],
)
def test_lines_before_a_family_key_count_as_its_legacy_value(
    tmp_path, posterior, key, default, legacy, other
):
    """A STAR line without ``offdiagonal`` was trained with plain off-diagonal blocks, a global
    deep-GP line without ``last_layer`` with its last layer sampled: the sweep reruns them with the
    current default, the report shows them as their own rows, and other families never carry
    the key."""
    old = _line(0, 0.01, -2.4, -0.4, 3.0, posterior=posterior)
    old.pop(key, None)
    res = tmp_path / "res"
    res.mkdir()
    path = res / "lines.jsonl"
    path.write_text(json.dumps(old) + "\n")
    done = uci.done_set(str(path))
    cfg = uci.normalise_config({k: old[k] for k in uci.CONFIG_KEYS if k in old})
    assert cfg[key] == default
    assert (uci.config_key(cfg), 0) not in done
    assert (uci.config_key(uci.normalise_config(dict(cfg, **{key: legacy}))), 0) in done
    assert uci.normalise_config({"dataset": "boston", "posterior": other})[key] is None
    bnn = {"dataset": "boston", "model": "bnn", "posterior": "global"}
    assert uci.normalise_config(bnn)[key] == ("marginal" if key == "last_layer" else None)
    assert uci.normalise_config(dict(bnn, posterior="factorised"))[key] is None
    with pytest.raises(ValueError, match=key):
        uci.normalise_config({"dataset": "boston", "posterior": other, key: legacy})
    with pytest.raises(ValueError, match=key):
        uci.normalise_config({"dataset": "boston", "posterior": posterior, key: "sideways"})
    new = _line(0, 0.01, -2.3, -0.3, 2.9, posterior=posterior, **{key: default})
    path.write_text("".join(json.dumps(x) + "\n" for x in (old, new)))
    assert (
        uci.main(
            ["report", "--results", str(res), "--out-dir", str(tmp_path / "rep"), "--no-plots"]
        )
        == 0
    )
    md = (tmp_path / "rep" / "uci.md").read_text()
    mark = {"offdiagonal": "plain", "last_layer": "U_L sampled"}[key]
    assert f"| boston | {posterior} ({mark}) | 2 | 100 | 100 | 1 | -2.40 (1 split) |" in md
    assert f"| boston | {posterior} | 2 | 100 | 100 | 1 | -2.30 (1 split) |" in md


def test_fully_coupled_lines_with_a_null_offdiagonal_are_plain(tmp_path):
    """Fully-coupled lines written before the family carried ``offdiagonal`` store ``null`` there:
    they count as the plain storage (what they were trained with). The family's default is now
    the preconditioned storage, so a configuration without the key is not done by them, one with
    ``offdiagonal = "plain"`` is, and the report marks the plain line."""
    old = _line(0, 0.01, -2.4, -0.4, 3.0, posterior="fully_coupled", offdiagonal=None)
    res = tmp_path / "res"
    res.mkdir()
    path = res / "lines.jsonl"
    path.write_text(json.dumps(old) + "\n")
    cfg = uci.normalise_config(
        {k: v for k, v in old.items() if k in uci.CONFIG_KEYS and k != "offdiagonal"}
    )
    assert cfg["offdiagonal"] == "preconditioned"
    assert (uci.config_key(cfg), 0) not in uci.done_set(str(path))
    plain = uci.normalise_config(dict(cfg, offdiagonal="plain"))
    assert (uci.config_key(plain), 0) in uci.done_set(str(path))
    new = _line(0, 0.01, -2.3, -0.3, 2.9, posterior="fully_coupled", offdiagonal="preconditioned")
    path.write_text("".join(json.dumps(x) + "\n" for x in (old, new)))
    assert (
        uci.main(
            ["report", "--results", str(res), "--out-dir", str(tmp_path / "rep"), "--no-plots"]
        )
        == 0
    )
    md = (tmp_path / "rep" / "uci.md").read_text()
    assert "| boston | fully_coupled (plain) | 2 | 100 | 100 | 1 | -2.40 (1 split) |" in md
    assert "| boston | fully_coupled | 2 | 100 | 100 | 1 | -2.30 (1 split) |" in md


def test_extrapolation_section_against_hand_computation(tmp_path):
    rng = np.random.default_rng(0)
    lines = []
    star_pts, mf_pts = {}, {}
    for split in (0, 1):
        for post in ("stripes_arrow", "mean_field"):
            pts = rng.normal(size=50)
            (star_pts if post == "stripes_arrow" else mf_pts)[split] = pts
            extra = {"offdiagonal": "preconditioned"} if post == "stripes_arrow" else {}
            lines.append(
                _line(
                    split,
                    0.01,
                    float(pts.mean()),
                    -0.5,
                    3.0,
                    dataset="kin8nm",
                    posterior=post,
                    protocol="extrapolation",
                    test_ll_points=pts.tolist(),
                    test_pit=rng.uniform(size=50).tolist(),
                    **extra,
                )
            )
    # a STAR line written before the offdiagonal key: plain blocks, its own row
    plain_pts = rng.normal(size=50)
    lines.append(
        _line(
            0,
            0.01,
            float(plain_pts.mean()),
            -0.5,
            3.0,
            dataset="kin8nm",
            posterior="stripes_arrow",
            protocol="extrapolation",
            test_ll_points=plain_pts.tolist(),
            test_pit=rng.uniform(size=50).tolist(),
        )
    )
    lines.append(_line(0, 0.01, -2.3, -0.3, 2.9))  # a random-protocol line stays in the main tables
    res = tmp_path / "res"
    res.mkdir()
    (res / "x.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert uci.main(["report", "--results", str(res), "--out-dir", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "uci.md").read_text()
    main, extra = md.split("## Extrapolation")
    assert "kin8nm" not in main and "| boston | global |" in main
    freqs = [np.mean(star_pts[s] > mf_pts[s]) for s in (0, 1)]
    m, se = np.mean(freqs), np.std(freqs, ddof=1) / np.sqrt(2)
    assert (
        f"| kin8nm | 2 | 100 | stripes_arrow | mean_field | 2 | {m:.2f} ± {se:.2f} | 0.36 ± 0.03 |"
        in extra
    )
    f_plain = np.mean(plain_pts > mf_pts[0])
    assert (
        f"| kin8nm | 2 | 100 | stripes_arrow (plain) | mean_field | 1 | {f_plain:.2f} (1 split) | "
        "0.36 ± 0.03 |" in extra
    )
    assert (
        f"| kin8nm | stripes_arrow (plain) | 2 | 100 | 1 | {plain_pts.mean():.2f} (1 split) |"
        in extra
    )
    ll = [star_pts[s].mean() for s in (0, 1)]
    assert (
        f"| kin8nm | stripes_arrow | 2 | 100 | 2 | {np.mean(ll):.2f} ± "
        f"{np.std(ll, ddof=1) / np.sqrt(2):.2f} |" in extra
    )
    assert (tmp_path / "rep" / "calibration.png").stat().st_size > 1000
    # per-point lines of different lengths cannot be compared
    bad = dict(lines[0], test_ll_points=[0.0])
    with pytest.raises(ValueError, match="test points"):
        uci.star_beats_frequency(bad, lines[1])


def test_extrapolation_rows_of_another_training_protocol_are_their_own_and_paired_among_themselves(
    tmp_path,
):
    rng = np.random.default_rng(1)
    pts = {}
    lines = []
    for protocol in ("ours", "lindinger"):
        extra = (
            {"train_samples": 5, "learning_rate_decay": [0.98, 1000]}
            if protocol == "lindinger"
            else {}
        )
        for post in ("stripes_arrow", "mean_field"):
            pts[protocol, post] = rng.normal(size=40)
            off = {"offdiagonal": "preconditioned"} if post == "stripes_arrow" else {}
            lines.append(
                _line(
                    0,
                    0.005,
                    float(pts[protocol, post].mean()),
                    -0.5,
                    3.0,
                    dataset="concrete",
                    posterior=post,
                    protocol="extrapolation",
                    test_ll_points=pts[protocol, post].tolist(),
                    test_pit=rng.uniform(size=40).tolist(),
                    **extra,
                    **off,
                )
            )
    res = tmp_path / "res"
    res.mkdir()
    (res / "x.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert uci.main(["report", "--results", str(res), "--out-dir", str(tmp_path / "rep")]) == 0
    extra = (tmp_path / "rep" / "uci.md").read_text().split("## Extrapolation")[1]
    mark = "5 samples, lr 0.005 x0.98/1000"
    for protocol, suffix in (("ours", ""), ("lindinger", f" ({mark})")):
        f = np.mean(pts[protocol, "stripes_arrow"] > pts[protocol, "mean_field"])
        assert (
            f"| concrete | 2 | 100 | stripes_arrow{suffix} | mean_field{suffix} | 1 | {f:.2f} (1 "
            "split) | 0.57 ± 0.04 |"
        ) in extra
    # no row pairs one protocol's STAR with the other's mean-field
    assert f"| stripes_arrow | mean_field ({mark}) |" not in extra
    assert f"| stripes_arrow ({mark}) | mean_field |" not in extra


def test_calibration_plot_draws_each_configuration_once(tmp_path, monkeypatch):
    """The report's extrapolation lines of one method at two step budgets (and the plain-STAR
    variant) are different configurations: each is one line, in a panel of its dataset and step
    budget, so that no method is listed twice in a panel; a configuration keeps its family's colour
    and its own line style in every panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rng = np.random.default_rng(1)
    lines = []
    for dataset in ("concrete", "kin8nm"):
        for steps in (2000, 10000):
            for post, extra in (
                ("mean_field", {}),
                ("stripes_arrow", {"offdiagonal": "preconditioned"}),
                ("stripes_arrow", {"offdiagonal": "plain"}),
            ):
                for split in (0, 1):
                    lines.append(
                        _line(
                            split,
                            0.01,
                            -1.0,
                            -0.5,
                            3.0,
                            dataset=dataset,
                            posterior=post,
                            steps=steps,
                            depth=3,
                            protocol="extrapolation",
                            test_ll_points=[0.0],
                            test_pit=rng.uniform(size=40).tolist(),
                            **extra,
                        )
                    )
    lines = [
        r
        for r in lines
        if not (r["dataset"] == "kin8nm" and r["steps"] == 2000 and r.get("offdiagonal") == "plain")
    ]
    figures = []
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig))
    assert uci.plot_calibration(
        [uci.with_legacy_values(r) for r in lines], str(tmp_path / "calibration.png")
    )
    (fig,) = figures
    colours, styles, drawn = {}, {}, []
    for ax in fig.axes:
        handles, labels = ax.get_legend_handles_labels()
        configs = [
            label.rsplit(" (", 1)[0] for label in labels if label != "calibrated"
        ]  # e.g. mean_field-3
        assert len(configs) == len(set(configs)), labels  # no configuration twice in a panel
        steps = [s for s in (2000, 10000) if f"{s} steps" in ax.get_title()]
        assert len(steps) == 1, ax.get_title()
        for handle, label in zip(handles, labels):
            if label != "calibrated":
                drawn.append((ax.get_title().split(",")[0], steps[0], label))
                colours.setdefault(label.rsplit(" (", 1)[0], set()).add(
                    matplotlib.colors.to_hex(handle.get_color())
                )
                styles.setdefault(label.rsplit(" (", 1)[0], set()).add(
                    (matplotlib.colors.to_hex(handle.get_color()), str(handle.get_linestyle()))
                )
    expected = {
        (
            r["dataset"],
            r["steps"],
            r["posterior"] + (" (plain)" if r.get("offdiagonal") == "plain" else ""),
        )
        for r in lines
    }
    assert len(drawn) == len(expected) == 11  # each configuration once
    assert {(d, s, label.split("-3 (")[0]) for d, s, label in drawn} == expected
    assert all(label.endswith("-3 (2 splits)") for _, _, label in drawn)
    assert all(len(c) == 1 for c in colours.values()), (
        colours
    )  # one colour per method in every panel
    # the family's colour (STAR's plain variant has STAR's, told apart by its line style)
    from benchmarks import plot_style

    assert colours == {
        "mean_field-3": {plot_style.FAMILY_COLOURS["mean_field"]},
        "stripes_arrow-3": {plot_style.FAMILY_COLOURS["stripes_arrow"]},
        "stripes_arrow (plain)-3": {plot_style.FAMILY_COLOURS["stripes_arrow"]},
    }
    assert all(len(s) == 1 for s in styles.values()), styles  # one style per configuration
    assert len({s for ss in styles.values() for s in ss}) == 3  # and no two alike


def test_latent_comparison_pairs_the_plain_family_split_by_split():
    """Δ test LL is the mean over the common splits of latent minus plain, with its SE; a plain
    split without a latent partner is left out, and the cost is the ratio of median ms/step."""
    plain = [
        _line(k, 0.01, ll, -0.3, 3.0, posterior="mean_field")
        for k, ll in enumerate([-2.50, -2.40, -2.60, -9.0])
    ]
    latent = [
        _line(k, 0.01, ll, -0.3, 2.5, posterior="mean_field", latent_dim=1, importance_samples=5)
        | {"ms_per_step": 30.0}
        for k, ll in enumerate([-2.30, -2.25, -2.35])
    ]
    text = uci.render_latent_comparison(plain + latent)
    row = [line for line in text.splitlines() if line.startswith("| boston | mean_field |")]
    assert len(row) == 1
    cells = [c.strip() for c in row[0].strip("|").split("|")]
    diffs = np.array([0.20, 0.15, 0.25])
    assert cells[5] == "3"
    assert cells[6] == uci._fmt(
        np.mean([-2.50, -2.40, -2.60]), np.std([-2.50, -2.40, -2.60], ddof=1) / math.sqrt(3)
    )
    assert cells[8] == uci._fmt(diffs.mean(), diffs.std(ddof=1) / math.sqrt(3))
    assert cells[9] == "3.00 / 2.50"
    assert cells[10] == "3.0"
    assert cells[11] == "yes"
    worse = [x | {"test_ll": x["test_ll"] - 1.0} for x in latent]
    assert uci.render_latent_comparison(plain + worse).splitlines()[-1].endswith("| no |")
    assert uci.render_latent_comparison(plain) == ""


@pytest.mark.slow  # trains a tiny model and restores it: `make test-all`
def test_layers_reads_the_checkpoint_of_a_run_in_training(tmp_path, capsys):
    """``layers`` rebuilds a task's model, restores its checkpoint and prints the restored model's
    per-layer variances: the same numbers as the in-memory model that wrote the checkpoint (not the
    untrained model's, which ``--untrained`` prints)."""
    from deepgp_gi import fit
    from deepgp_gi.uci_protocol import build_model, layer_variances_on_training_rows

    sweep = tmp_path / "tiny.toml"
    sweep.write_text(TINY)
    ((group, cfg, split),) = uci.load_sweep(str(sweep))
    ckdir = tmp_path / "ckpt"
    assert (
        uci.main(["layers", str(sweep), "--checkpoint-dir", str(ckdir)]) == 1
    )  # nothing to read yet
    capsys.readouterr()

    model, data = build_model(cfg, split)
    _, untrained = layer_variances_on_training_rows(model, data, cfg, split)
    fit(
        model,
        (data.X_train, data.Y_train),
        steps=30,
        learning_rate=0.05,
        seed=0,
        checkpoint_dir=uci._task_dir(str(ckdir), cfg, split),
        checkpoint_every=30,
    )
    rows, trained = layer_variances_on_training_rows(model, data, cfg, split)
    assert trained != untrained

    def printed(text):
        table = [ln for ln in text.splitlines() if re.match(r"\| \d+ \|", ln)]
        return [[float(v) for v in ln.strip("|").split("|")[1:]] for ln in table]

    out_md = tmp_path / "layers.md"
    assert (
        uci.main(["layers", str(sweep), "--checkpoint-dir", str(ckdir), "--out", str(out_md)]) == 0
    )
    text = capsys.readouterr().out
    assert "checkpoint at step 30" in text and f"first {rows} training rows" in text
    np.testing.assert_allclose(
        printed(text), np.c_[trained.between_rows, trained.within_samples], rtol=1e-3
    )
    assert "Command: `" in out_md.read_text() and printed(out_md.read_text()) == printed(text)

    assert uci.main(["layers", str(sweep), "--untrained"]) == 0
    np.testing.assert_allclose(
        printed(capsys.readouterr().out),
        np.c_[untrained.between_rows, untrained.within_samples],
        rtol=1e-3,
    )


def test_sweep_filters_select_runs_within_a_group_and_a_typo_is_an_error(tmp_path, capsys):
    sweep = tmp_path / "two.toml"
    sweep.write_text(
        TINY.replace('datasets = ["yacht"]', 'datasets = ["yacht", "energy"]')
        .replace('posteriors = ["mean_field"]', 'posteriors = ["mean_field", "global"]')
        .replace("splits = [0]", "splits = [0, 1]")
    )
    out = tmp_path / "res.jsonl"

    def dry(*extra):
        capsys.readouterr()
        code = uci.main(["sweep", str(sweep), "--out", str(out), "--dry-run", *extra])
        io = capsys.readouterr()
        return code, [x.strip() for x in io.out.splitlines() if x.startswith("  tiny:")], io.err

    code, runs, _ = dry()
    assert code == 0 and len(runs) == 8
    code, runs, _ = dry(
        "--only", "tiny", "--dataset", "energy", "--posterior", "global", "--split", "1"
    )
    assert code == 0 and runs == [
        "tiny: energy gp global depth 2 prior None lr 0.01 steps 20 split 1"
    ]
    code, runs, _ = dry("--depth", "2", "--split", "0")
    assert code == 0 and len(runs) == 4 and all(r.endswith("split 0") for r in runs)
    for extra, message in (
        (("--only", "tiny,tinny"), "--only: no group 'tinny'"),
        (
            ("--dataset", "yaht"),
            "--dataset 'yaht' matches no task of the selection (it has: energy, yacht)",
        ),
        (("--depth", "3"), "--depth 3 matches no task"),
        (("--split", "2"), "--split 2 matches no task"),
    ):
        code, runs, err = dry(*extra)
        assert code == 2 and not runs and message in err, (extra, err)
    # a task's options other than the protocol's usual ones follow its split
    sweep.write_text(TINY.replace('model = "gp"', 'model = "gp"\nlikelihood = "student_t"'))
    code, runs, _ = dry()
    assert code == 0 and runs == [
        "tiny: yacht gp mean_field depth 2 prior None lr 0.01 steps 20 split 0, Student-t, df 4"
    ]


# ------------------------------------------------------------------ the choice on validation data
def _vline(split, posterior, valid_ll, test_ll, dataset="boston", depth=2, ms=10.0, **extra):
    """A result line trained with a validation split (10 % of the training rows held out)."""
    return _line(
        split,
        0.01,
        test_ll,
        -0.3,
        3.0,
        dataset=dataset,
        posterior=posterior,
        validation=0.1,
        valid_ll=valid_ll,
        valid_rmse=2.5,
        n_valid=46,
        depth=depth,
        ms_per_step=ms,
        **extra,
    )


def _records(lines):
    return [uci.with_legacy_values(r) for r in lines]


def test_the_validation_key_is_normalised_and_older_lines_have_none():
    cfg = uci.normalise_config({"dataset": "boston", "validation": True})
    assert cfg["validation"] == 0.1
    assert uci.normalise_config({"dataset": "boston", "validation": 0.2})["validation"] == 0.2
    for off in (None, False):
        assert uci.normalise_config({"dataset": "boston", "validation": off})["validation"] is None
    for bad in (0, 1.0, -0.5, "yes"):
        with pytest.raises((TypeError, ValueError), match="validation"):
            uci.normalise_config({"dataset": "boston", "validation": bad})
    # a line written before the key matches the configuration without a validation split, not one
    # with it
    old = _line(0, 0.01, -2.4, -0.3, 3.0)
    plain = uci.normalise_config({k: v for k, v in old.items() if k in uci.CONFIG_KEYS})
    assert plain["validation"] is None and uci.config_key(old) == uci.config_key(plain)
    assert uci.config_key(old) != uci.config_key(dict(plain, validation=0.1))
    from benchmarks.experiment_config import LEGACY_VALUES

    assert "validation" in LEGACY_VALUES and LEGACY_VALUES["validation"] is None


def test_a_sweep_group_with_validation_runs_as_its_own_tasks(tmp_path):
    sweep = tmp_path / "v.toml"
    sweep.write_text(
        '[defaults]\nsteps = 10\n[[group]]\nname = "plain"\nmodel = "gp"\ndatasets = ["yacht"]\n'
        'posteriors = ["global"]\nsplits = [0]\n[[group]]\nname = "valid"\nmodel = "gp"\n'
        'validation = true\ndatasets = ["yacht"]\nposteriors = ["global"]\nsplits = [0]\n'
    )
    tasks = uci.load_sweep(str(sweep))
    assert [(g, c["validation"]) for g, c, _ in tasks] == [("plain", None), ("valid", 0.1)]


def test_the_choice_goes_by_validation_not_test():
    """global has the better mean validation LL over splits 0-2, mean_field the better test LL: the
    rule picks global and reports its test LL over all its splits (split 3 included)."""
    lines = [_vline(s, "global", -2.30 + 0.01 * s, -2.60) for s in range(3)] + [
        _vline(3, "global", -9.0, -2.20)
    ]
    lines += [_vline(s, "mean_field", -2.40, -2.10) for s in range(3)]
    chosen = uci.choose_on_validation(_records(lines))
    c = chosen["boston"]
    assert c["config"]["posterior"] == "global" and len(c["runs"]) == 4
    assert c["valid_ll"] == pytest.approx(-2.29)  # splits 0-2 only: split 3's -9.0 is not scored
    m, se, _ = uci.mean_se([-2.60, -2.60, -2.60, -2.20])
    assert c["test_ll"] == (pytest.approx(m), pytest.approx(se))


def test_a_configuration_missing_one_of_the_first_splits_is_not_eligible():
    lines = [_vline(s, "global", -2.0, -2.0) for s in (0, 1, 3)]  # the best scores, but no split 2
    lines += [_vline(s, "mean_field", -2.5, -2.5) for s in (0, 1, 2)]
    lines += [
        _vline(0, "sghmc", float("nan"), -2.4),
        _vline(1, "sghmc", -1.0, -2.4),
        _vline(2, "sghmc", -1.0, -2.4),
    ]
    cands = {
        c["config"]["posterior"]: c for c in uci.validation_candidates(_records(lines))["boston"]
    }
    assert not cands["global"]["eligible"] and cands["global"]["missing"] == [2]
    assert not cands["sghmc"]["eligible"] and cands["sghmc"]["missing"] == [
        0
    ]  # a NaN validation LL
    assert (
        uci.choose_on_validation(_records(lines))["boston"]["config"]["posterior"] == "mean_field"
    )
    # with K = 2 the global configuration is eligible and chosen
    assert (
        uci.choose_on_validation(_records(lines), k=2)["boston"]["config"]["posterior"] == "global"
    )
    # no eligible configuration: the data set has no choice
    assert "boston" not in uci.choose_on_validation(_records(lines[:3]))


def test_a_tie_goes_to_the_cheaper_configuration_then_the_key_order():
    lines = [_vline(s, "mean_field", -2.3, -2.0, ms=40.0) for s in range(3)]
    lines += [_vline(s, "global", -2.3, -2.9, ms=12.0) for s in range(3)]
    assert uci.choose_on_validation(_records(lines))["boston"]["config"]["posterior"] == "global"
    same_cost = [dict(r, ms_per_step=10.0) for r in lines]
    picked = uci.choose_on_validation(_records(same_cost))["boston"]
    keys = sorted(c["key"] for c in uci.validation_candidates(_records(same_cost))["boston"])
    assert picked["key"] == keys[0]


def test_lines_without_a_validation_split_are_no_candidates_and_data_sets_are_apart():
    lines = [_line(s, 0.01, -1.0, -0.1, 2.0) for s in range(3)]  # the old lines: no validation
    lines += [_vline(s, "global", -2.5, -2.6, dataset="yacht") for s in range(3)]
    lines += [
        _vline(s, "mean_field", -2.4, -2.7, dataset="yacht", protocol="extrapolation")
        for s in range(3)
    ]
    cands = uci.validation_candidates(_records(lines))
    assert (
        list(cands) == ["yacht"] and len(cands["yacht"]) == 1
    )  # extrapolation lines are not candidates
    assert uci.choose_on_validation(_records(lines))["yacht"]["config"]["posterior"] == "global"


def test_the_report_has_the_validation_section_with_the_choice_and_the_test_picked_row(tmp_path):
    lines = [_vline(s, "global", -2.30, -2.50) for s in range(3)]
    lines += [_vline(s, "mean_field", -2.40, -2.20, depth=3) for s in range(2)]  # lacks split 2
    lines += [
        _line(s, 0.01, -2.35, -0.3, 3.0, posterior="mean_field") for s in range(3)
    ]  # whole training splits
    # the choice retrained on the whole training splits 0 and 1 (the refit)
    lines += [_line(s, 0.01, -2.45, -0.3, 3.0, posterior="global") for s in range(2)]
    res = tmp_path / "res"
    res.mkdir()
    (res / "v.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    ref = tmp_path / "ref.csv"
    ref.write_text(
        "model,dataset,posterior,depth,prior,metric,mean,se,source,n_splits\n"
        "gp,boston,global,2,,test_ll,-2.42,0.05,O&A Tab. 8-10,20\n"
        "gp,boston,bsgp,2,,test_ll,-2.10,0.05,Rossi supp. Tab. 2 (80/20 splits),\n"
    )
    assert (
        uci.main(
            [
                "report",
                "--results",
                str(res),
                "--out-dir",
                str(tmp_path / "rep"),
                "--reference",
                str(ref),
                "--no-plots",
            ]
        )
        == 0
    )
    md = (tmp_path / "rep" / "uci.md").read_text()
    assert "## Chosen on validation data" in md and "numpy.random.default_rng(1000 + split)" in md
    # the choice, against the best 90/10 number (O&A's GI-2, not Rossi's 80/20 BSGP), its refit
    # (the gap in SEs of the difference: 0.03 / 0.05), and the test-picked row
    assert (
        "| boston | 1 of 2 | global | 2 | 100 | -2.30 | -2.50 ± 0.00 | 3 | O&A GI-2 -2.42 | -0.08 "
        "| -2.45 ± 0.00 | 2 | -0.03 (0.6 SE) | mean_field, depth 2, 100 steps, 3 splits | "
        "-2.35 ± 0.00 |"
    ) in md
    assert (
        "| boston | global | 2 | 100 | 0, 1, 2 | -2.30 | 2.5 | -2.50 ± 0.00 | 3 | **yes** |" in md
    )
    assert (
        "| boston | mean_field | 3 | 100 | 0, 1 | not eligible: lacks split 2 | — | -2.20 ± 0.00 | "
        "2 |  |" in md
    )
    # the full tables keep the validation rows apart, marked
    assert "| boston | global (validation 10%) | 2 | 100 | 100 | 3 | -2.50 ± 0.00 |" in md


def test_the_refit_runs_are_the_chosen_configuration_on_whole_training_splits_only():
    lines = [_vline(s, "global", -2.30, -2.50) for s in range(3)]
    lines += [_vline(s, "mean_field", -2.40, -2.20) for s in range(3)]
    refit = [_line(s, 0.01, -2.4 - s / 100, -0.3, 3.0, posterior="global") for s in (2, 0)]
    others = [
        _line(1, 0.01, -2.0, -0.3, 3.0, posterior="mean_field"),  # not the choice
        _line(1, 0.01, -2.0, -0.3, 3.0, posterior="global", num_inducing=50),  # another M
        _line(1, 0.01, -2.0, -0.3, 3.0, posterior="global", protocol="random_80_20"),
    ]
    records = _records(lines + refit + others)
    chosen = uci.choose_on_validation(records)
    runs = uci.refit_runs(records, chosen)["boston"]
    assert [r["split"] for r in runs] == [0, 2]  # in split order
    assert [r["test_ll"] for r in runs] == [-2.4, -2.42]
    assert uci.refit_runs(_records(lines), chosen) == {}


def test_a_validation_candidate_with_other_inducing_points_is_its_own_marked_candidate():
    exp = dict(depth=3, positive_transform="exp")
    lines = [_vline(s, "sghmc", -2.30, -2.50, **exp) for s in range(3)]
    lines += [_vline(s, "sghmc", -2.25, -2.60, num_inducing=128, **exp) for s in range(3)]
    cands = uci.validation_candidates(_records(lines))["boston"]
    assert len(cands) == 2
    chosen = uci.choose_on_validation(_records(lines))["boston"]
    assert chosen["config"]["num_inducing"] == 128 and chosen["test_ll"][0] == pytest.approx(-2.6)
    assert uci._plain_method(chosen["config"]) == "sghmc (M = 128)"
    assert uci._plain_method(dict(chosen["config"], chain_steps=21)).endswith(", M = 128)")
    assert uci._plain_method(cands[0]["config"]) == "sghmc"
    assert uci._plain_method(dict(cands[0]["config"], num_inducing=50)) == "sghmc (M = 50)"


def test_the_lowest_test_points_of_a_chosen_split_are_set_apart_in_the_report(tmp_path):
    pts = [-0.5] * 70 + [-40.0, -20.0, -3.0, -0.9]
    low = uci.lowest_points(pts)
    assert low["lowest"] == [-40.0, -20.0, -3.0] and low["n"] == 74
    assert low["test_ll"] == pytest.approx(np.mean(pts))
    assert low["rest"] == pytest.approx((70 * -0.5 - 0.9) / 71)
    with pytest.raises(ValueError, match="points"):
        uci.lowest_points([-1.0, -2.0, -3.0])
    lines = [_vline(s, "global", -2.30, float(np.mean(pts))) for s in range(3)]
    lines[1]["test_ll_points"] = pts  # one split records its points
    lines += [_vline(s, "mean_field", -2.40, -2.20) for s in range(3)]  # not chosen
    lines[4]["test_ll_points"] = [-1.0] * 10
    chosen = uci.choose_on_validation(_records(lines))
    text = "\n".join(uci.render_pointwise(chosen))
    assert "| boston | 1 | -1.34 | -40.0, -20.0, -3.0 | -0.51 | 74 |" in text
    assert text.count("| boston |") == 1  # the other splits and the other candidate have none
    alone = "\n".join(uci.render_pointwise(uci.choose_on_validation(_records(lines[3:]))))
    assert "| boston | 1 | -1.00 | -1.0, -1.0, -1.0 | -1.00 | 10 |" in alone
    without = [dict(r) for r in lines]
    for r in without:
        r.pop("test_ll_points", None)
    assert uci.render_pointwise(uci.choose_on_validation(_records(without))) == []


def test_published_rows_from_the_reference_name_the_paper_and_protocol():
    pub = uci.published_from_reference(uci.load_reference())
    boston = {(p["source"], p["method"], p["depth"]): p for p in pub if p["dataset"] == "boston"}
    assert (
        boston[("O&A", "GI", 5)]["protocol"] == "random 90/10"
        and boston[("O&A", "GI", 5)]["n_splits"] == 20
    )
    assert boston[("Rossi", "BSGP", 2)]["protocol"] == "80/20"
    assert boston[("Lindinger", "STAR", 3)]["test_ll"] == pytest.approx(-2.43)
    assert not [p for p in pub if p["method"] in ("fac", "gi")]  # the BNN numbers are not deep GPs
    best = uci.best_published("yacht", pub, uci.RANDOM_PROTOCOL)
    assert (best["source"], best["method"], best["depth"]) == ("O&A", "LI", 3)
    assert uci.best_published("yacht", pub)["source"] == "Rossi"


def test_the_validation_sweep_holds_out_rows_in_every_run_and_runs_the_leaders_first():
    tasks = uci.load_sweep(os.path.join(ROOT, "benchmarks", "sweeps", "uci_validation.toml"))
    # the chosen configurations on splits 3-9 (what the committed lines choose): ten splits, as
    # the published rows' repetitions, split-major (every set reaches five first); the rest on 0-2
    chosen = [(c["dataset"], s) for g, c, s in tasks if g == "valid-chosen-splits3-9"]
    assert {s for _, s in chosen} == set(range(3, 10))
    assert [s for _, s in chosen] == sorted(s for _, s in chosen)
    # the choices retrained on the whole training splits 0-9: nothing held out
    refit = [(c["dataset"], s) for g, c, s in tasks if g == "valid-chosen-refit"]
    assert {s for _, s in refit} == set(range(10)) and {d for d, _ in refit} == {
        d for d, _ in chosen
    }
    assert all(c["validation"] is None for g, c, _ in tasks if g == "valid-chosen-refit")
    tasks = [t for t in tasks if t[0] not in ("valid-chosen-splits3-9", "valid-chosen-refit")]
    assert all(s in (0, 1, 2) for _, _, s in tasks)
    assert all(c["validation"] == 0.1 for _, c, _ in tasks)
    # the papers' 20,000 steps, but the latent-variable leaders first at the 5,000 of their test
    # rows (and again at 20,000)
    assert all(
        c["steps"] == (5000 if c.get("latent_dim") and "20k" not in g else 20000)
        for g, c, _ in tasks
    )
    assert {c["dataset"] for _, c, _ in tasks} == {"boston", "concrete", "energy", "wine", "yacht"}
    first = ("valid-leaders", "valid-latent-leaders", "valid-predictive-d2")
    leaders = [t for t in tasks if t[0].startswith(first)]
    assert tasks[: len(leaders)] == leaders
    # after the leaders every set has three configurations on each of splits 0-2, two families on
    # the ELBO and mean-field-2 on the predictive objective (yacht and wine also their
    # latent-variable leader)
    for d in ("boston", "concrete", "energy", "wine", "yacht"):
        configs = {uci.config_key(c) for _, c, _ in leaders if c["dataset"] == d}
        n = 4 if d in ("wine", "yacht") else 3
        assert len(configs) == n and sum(c["dataset"] == d for _, c, _ in leaders) == 3 * n
    # then the family and depth of each published best that is not among them, then global-2 on
    # the predictive objective
    rest = tasks[len(leaders) :]
    published = [t for t in rest if t[0].startswith("valid-published-methods")]
    assert rest[: len(published)] == published
    assert {(c["dataset"], c["posterior"], c["depth"]) for _, c, _ in published} == {
        ("energy", "sghmc", 3),
        ("concrete", "sghmc", 3),
        ("wine", "sghmc", 3),
        ("yacht", "local", 3),
    }
    after = rest[len(published) :]
    assert {g for g, _, _ in after[:15]} == {"valid-predictive-global-d2"}


def test_the_objective_key_is_normalised_refused_where_it_cannot_train_and_marked(tmp_path):
    assert uci.normalise_config({"dataset": "boston"})["objective"] is None
    assert uci.normalise_config({"dataset": "boston", "objective": "elbo"})["objective"] is None
    cfg = uci.normalise_config(
        {"dataset": "boston", "posterior": "dspp", "objective": "predictive"}
    )
    assert cfg["objective"] == "predictive"
    assert uci.config_key(cfg) != uci.config_key(dict(cfg, objective=None))
    for bad in (
        {"posterior": "sghmc"},
        {"model": "bnn", "posterior": "global"},
        {"posterior": "global", "latent_dim": 1},
    ):
        with pytest.raises(ValueError, match="objective"):
            uci.normalise_config({"dataset": "boston", "objective": "predictive", **bad})
    with pytest.raises(ValueError, match="objective"):
        uci.normalise_config({"dataset": "boston", "objective": "likelihood"})
    old = _line(0, 0.01, -2.4, -0.3, 3.0)  # written before the key: the ELBO
    assert uci.config_key(old) == uci.config_key(dict(old, objective=None))
    lines = [
        _line(0, 0.01, -2.4, -0.3, 3.0, posterior="dspp"),
        _line(0, 0.01, -2.2, -0.4, 3.0, posterior="dspp", objective="predictive"),
    ]
    res = tmp_path / "res"
    res.mkdir()
    (res / "l.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert (
        uci.main(
            ["report", "--results", str(res), "--out-dir", str(tmp_path / "rep"), "--no-plots"]
        )
        == 0
    )
    md = (tmp_path / "rep" / "uci.md").read_text()
    assert "| boston | dspp | 2 | 100 | 100 | 1 | -2.40 (1 split) |" in md
    assert "| boston | dspp (predictive objective) | 2 | 100 | 100 | 1 | -2.20 (1 split) |" in md


def test_the_validation_sweeps_dspp_group_trains_on_the_predictive_objective():
    tasks = uci.load_sweep(os.path.join(ROOT, "benchmarks", "sweeps", "uci_validation.toml"))
    assert {c["objective"] for _, c, _ in tasks if c["posterior"] == "dspp"} == {"predictive"}
    groups = {"valid-predictive-d2", "valid-predictive-global-d2"}
    predictive = [(g, c) for g, c, _ in tasks if c["posterior"] != "dspp" and c["objective"]]
    assert groups <= {g for g, _ in predictive}
    # elsewhere only the chosen configurations' further splits, where the validation lines chose
    # one of those groups' configurations (as the result file stands)
    theirs = {uci.config_key(c) for g, c in predictive if g in groups}
    assert all(
        (g == "valid-chosen-splits3-9" and uci.config_key(c) in theirs)
        or (g == "valid-chosen-refit" and uci.config_key(dict(c, validation=0.1)) in theirs)
        for g, c in predictive
        if g not in groups
    )


def test_chain_steps_is_a_sampler_option_stored_only_when_not_one():
    from deepgp_gi import uci_protocol

    base = dict(dataset="boston", posterior="bsgp", depth=2)
    assert uci_protocol.normalise_config(dict(base, chain_steps=21))["chain_steps"] == 21
    assert uci_protocol.normalise_config(dict(base, chain_steps=1))["chain_steps"] is None
    assert uci_protocol.normalise_config(base)["chain_steps"] is None
    with pytest.raises(ValueError, match="chain_steps applies to the sampling families"):
        uci_protocol.normalise_config(dict(base, posterior="mean_field", chain_steps=21))
    with pytest.raises(ValueError, match="chain_steps must be at least 1"):
        uci_protocol.normalise_config(dict(base, chain_steps=0))
    model, _ = uci_protocol.build_model(
        dict(base, posterior="sghmc", chain_steps=21, num_inducing=5, protocol="random_80_20"), 0
    )
    assert model.posterior.chain_steps == 21


def test_kl_weight_and_inner_width_reach_fit_and_the_builder(monkeypatch):
    import deepgp_gi.training
    from deepgp_gi import uci_protocol

    base = dict(dataset="yacht", posterior="dspp", depth=2, objective="predictive")
    cfg = uci_protocol.normalise_config(dict(base, kl_weight=0.1, inner_width=5))
    assert cfg["kl_weight"] == 0.1 and cfg["inner_width"] == 5
    assert uci_protocol.normalise_config(dict(base, kl_weight=1.0))["kl_weight"] is None
    for bad, match in (
        (dict(kl_weight=0.0), "kl_weight applies"),
        (dict(kl_weight=1.5), "weight must be a number in"),
        (dict(posterior="sghmc", objective=None, kl_weight=0.5), "kl_weight applies"),
        (dict(inner_width=0), "inner_width must be at least 1"),
    ):
        with pytest.raises(ValueError, match=match):
            uci_protocol.normalise_config(dict(base, **bad))
    model, data = uci_protocol.build_model(
        dict(base, inner_width=3, num_inducing=5, protocol="random_75_15_10", validation=1 / 6), 9
    )
    assert model.layers[0].output_dim == 3
    assert data.X_test.shape[0] == round(0.1 * 308)
    schedules = []
    fit = deepgp_gi.training.fit

    def recording_fit(*args, **kwargs):
        schedules.append(kwargs.get("kl_schedule"))
        return fit(*args, **kwargs)

    monkeypatch.setattr(deepgp_gi.training, "fit", recording_fit)
    record = uci_protocol.run_split(
        dict(base, kl_weight=0.25, num_inducing=5, steps=2, test_samples=2, batch_size=50), 0
    )
    assert record["kl_weight"] == 0.25 and [s(0) for s in schedules] == [0.25]


def test_kernel_start_reaches_the_builder_and_is_refused_where_it_does_not_apply():
    from deepgp_gi import uci_protocol

    base = dict(dataset="energy", posterior="sghmc", depth=2)
    cfg = uci_protocol.normalise_config(dict(base, kernel_start="havasi"))
    assert cfg["kernel_start"] == "havasi"
    plain = uci_protocol.normalise_config(base)
    assert uci_protocol.normalise_config(dict(base, kernel_start="dsvi")) == plain
    assert plain["kernel_start"] is None
    old = {k: v for k, v in plain.items() if k != "kernel_start"}  # a line written before the key
    assert uci_protocol.config_key(old) == uci_protocol.config_key(plain)
    assert uci_protocol.config_key(cfg) != uci_protocol.config_key(plain)
    with pytest.raises(ValueError, match="unknown kernel_start 'reference'"):
        uci_protocol.normalise_config(dict(base, kernel_start="reference"))
    with pytest.raises(ValueError, match="kernel_start applies to deep GPs only"):
        uci_protocol.normalise_config(dict(base, model="bnn", kernel_start="havasi"))
    model, data = uci_protocol.build_model(dict(cfg, num_inducing=5), 0)
    last = model.layers[-1].kernel
    width = data.X_train.shape[1]  # energy: 8 inputs, inner width min(30, 8)
    np.testing.assert_allclose(last.variance.numpy(), 0.01)
    np.testing.assert_allclose(last.lengthscales.numpy(), np.full(width, np.sqrt(width)))
    assert uci._protocol_marks(cfg) == ["kernel start havasi"]
    import benchmarks.medium as medium

    assert medium._family(dict(cfg, collect_step_size=0.03)) == "sghmc+collect0.03+kstart-havasi"
    assert medium._family(plain) == "sghmc"


def test_rows_name_the_papers_protocols_and_their_options():
    marks = uci._protocol_marks(
        dict(protocol="random_80_20", chain_steps=21, kl_weight=0.1, inner_width=5)
    )
    assert marks == ["80/20 splits", "21 chain steps", "KL weight 0.1", "width 5"]
    assert uci._protocol_marks(dict(protocol="random")) == []
    assert uci._protocol_marks(dict(protocol="random_75_15_10", validation=1 / 6)) == [
        "75/15/10 splits",
        "validation 17%",
    ]


def test_a_gap_below_is_also_given_in_standard_errors_of_the_difference():
    pub = {"test_ll": -0.34, "se": 0.12}
    assert uci.gap_text(-0.30, pub, se=0.3) == "at or above"
    assert uci.gap_text(-0.55, pub) == "-0.21"  # no SE of ours: the gap alone
    # sqrt(0.16^2 + 0.12^2) = 0.2: a gap of 0.21 is 1.05 standard errors
    assert uci.gap_text(-0.55, pub, se=0.16) == "-0.21 (1.1 SE)"
    assert uci.gap_text(-0.55, {"test_ll": -0.34, "se": float("nan")}, se=0.07) == "-0.21 (3.0 SE)"
    assert uci.gap_text(-0.55, {"test_ll": -0.34}, se=float("nan")) == "-0.21"
    assert uci.gap_text(float("nan"), pub, se=0.1) == "—" and uci.gap_text(-1.0, None) == "—"


def test_a_chosen_from_group_runs_the_validation_choice_on_more_splits(tmp_path, monkeypatch):
    lines = [_vline(s, "global", -2.3, -2.2) for s in range(3)]
    lines += [_vline(s, "mean_field", -2.2, -2.4) for s in range(3)]  # chosen on boston
    lines += [_vline(s, "sghmc", -0.3, -0.5, dataset="energy") for s in range(2)]  # not eligible
    results = tmp_path / "results" / "valid.jsonl"
    results.parent.mkdir()
    results.write_text("".join(json.dumps(line) + "\n" for line in lines))
    monkeypatch.setattr(uci, "HERE", str(tmp_path / "benchmarks"))  # the root is tmp_path
    sweep = tmp_path / "chosen.toml"
    sweep.write_text(
        '[defaults]\nmodel = "gp"\n\n[[group]]\nname = "chosen"\n'
        'chosen_from = "results/valid.jsonl"\ndatasets = ["boston", "energy"]\nsplits = [3, 4]\n'
    )
    tasks = uci.load_sweep(str(sweep))
    assert [(g, c["dataset"], c["posterior"], s) for g, c, s in tasks] == [
        ("chosen", "boston", "mean_field", 3),
        ("chosen", "boston", "mean_field", 4),
    ]
    # the very configuration of the validation lines: their lines and the new ones make one row
    assert uci.config_key(tasks[0][1]) == uci.config_key(uci.with_legacy_values(lines[3]))
    assert tasks[0][1]["validation"] == 0.1
    # refit = true: the same choice trained on the whole training split, nothing held out
    sweep.write_text(
        '[[group]]\nname = "refit"\nchosen_from = "results/valid.jsonl"\nrefit = true\n'
        'datasets = ["boston"]\nsplits = [0]\n'
    )
    (refit,) = uci.load_sweep(str(sweep))
    assert refit[1]["validation"] is None
    assert uci.config_key(refit[1]) == uci.config_key(dict(tasks[0][1], validation=None))
    # protocol: the same choice on another split protocol's splits (a published number's own)
    sweep.write_text(
        '[[group]]\nname = "rossi"\nchosen_from = "results/valid.jsonl"\nrefit = true\n'
        'protocol = "random_80_20"\ndatasets = ["boston"]\nsplits = [0]\n'
    )
    (rossi,) = uci.load_sweep(str(sweep))
    assert rossi[1]["protocol"] == "random_80_20" and tasks[0][1]["protocol"] == "random"
    assert uci.config_key(rossi[1]) == uci.config_key(dict(refit[1], protocol="random_80_20"))

    def rejects(body, match):
        sweep.write_text(body)
        with pytest.raises(ValueError, match=match):
            uci.load_sweep(str(sweep))

    head = '[[group]]\nname = "g"\n'
    rejects(
        head + 'chosen_from = "results/valid.jsonl"\nrefit = "yes"\n'
        'datasets = ["boston"]\nsplits = [0]\n',
        "refit must be true or false",
    )
    rejects(
        head + 'refit = true\nposteriors = ["global"]\ndatasets = ["boston"]\nsplits = [0]\n',
        "needs chosen_from",
    )
    rejects(
        head + 'chosen_from = "results/valid.jsonl"\ndatasets = ["boston"]\n'
        'posteriors = ["global"]\nsplits = [3]\n',
        "no other keys",
    )
    rejects(
        head + 'chosen_from = "resluts/valid.jsonl"\ndatasets = ["boston"]\nsplits = [3]\n',
        "not in a folder",
    )
    rejects(
        head + 'chosen_from = "results/valid.jsonl"\nprotocol = "random_8020"\n'
        'datasets = ["boston"]\nsplits = [0]\n',
        "protocol",
    )
    sweep.write_text(
        head + 'chosen_from = "results/none.jsonl"\ndatasets = ["boston"]\nsplits = [3]\n'
    )
    assert uci.load_sweep(str(sweep)) == []  # a results file not yet written chooses nothing


def test_a_row_on_the_80_20_splits_is_its_own_marked_row_without_the_90_10_paper_number(tmp_path):
    reference = {("gp", "boston", "global", 2, None): {"test_ll": (-2.42, 0.05, "test", 20)}}
    plain = [_line(k, 0.01, -2.40, -0.3, 3.0) for k in range(2)]
    rossi = [_line(k, 0.01, -2.50, -0.3, 3.0, protocol="random_80_20") for k in range(2)]
    rows = {s["protocol"]: s for s in uci.summarise(_records(plain + rossi), reference)}
    assert rows["random"]["ok_test_ll"] is True
    assert rows["random_80_20"]["paper_test_ll"] is None
    assert uci._method(rows["random_80_20"]).endswith("(80/20 splits)")
    # the report's tables hold it; the figures beside the papers' numbers do not
    results = tmp_path / "results"
    results.mkdir()
    (results / "lines.jsonl").write_text("".join(json.dumps(r) + "\n" for r in plain + rossi))
    assert (
        uci.main(["report", "--results", str(results), "--out-dir", str(results), "--no-plots"])
        == 0
    )
    text = (results / "uci.md").read_text()
    assert "80/20 splits" in text and "-2.50 ± 0.00" in text


def test_the_cost_of_the_choice_is_measured_on_the_splits_it_was_made_on():
    lines = [_vline(s, "global", -1.0, 0.1 + 0.01 * s, dataset="yacht") for s in range(3)]
    lines += [_vline(s, "mean_field", -0.8, -0.5, dataset="yacht") for s in range(3)]  # chosen
    # the runner-up on validation: mean -0.9, ahead of the choice on no split
    lines += [_vline(s, "local", -1.0 + 0.1 * s, -0.2, dataset="yacht") for s in range(3)]
    lines += [_vline(3, "mean_field", -0.8, 9.0, dataset="yacht")]  # split 3: not in the cost
    lines += [_vline(3, "local", 5.0, 9.0, dataset="yacht")]  # nor in the margin
    lines += [_vline(s, "global", -2.3, -2.2) for s in range(3)]  # boston: one candidate
    (boston, yacht) = uci.selection_cost(_records(lines))
    assert boston["regret"] == 0.0 and np.isnan(boston["spearman"]) and boston["n_valid"] == 46
    assert yacht["chosen"]["config"]["posterior"] == "mean_field"
    assert yacht["chosen_test"] == pytest.approx(-0.5) and yacht["best_test"] == pytest.approx(0.11)
    assert yacht["regret"] == pytest.approx(0.61) and yacht["candidates"] == 3
    assert yacht["spearman"] == pytest.approx(-1.0)  # validation ranks them opposite to test
    # ahead of the runner-up by 0.2, 0.1 and 0.0 on splits 0-2: 0.1 ± 0.1 / sqrt(3)
    assert yacht["runner_up"]["config"]["posterior"] == "local"
    assert yacht["margin"] == pytest.approx(0.1)
    assert yacht["margin_se"] == pytest.approx(0.1 / 3**0.5)
    assert boston["runner_up"] is None and np.isnan(boston["margin"])
    text = uci.render_validation(_records(lines), [], "cmd")
    assert (
        "| yacht | 3 | 46 | mean_field-2 | -0.50 | global-2 | 0.11 | 0.61 | -1.00 | local-2 "
        "| +0.100 ± 0.058 |" in text
    )
    assert "| boston | 1 | 46 | global-2 | -2.20 | global-2 | -2.20 | 0.00 | — | — | — |" in text


@pytest.mark.parametrize("sweep", ["uci_validation.toml", "medium_validation.toml"])
def test_every_validation_sweep_task_names_a_split_its_data_set_has(sweep):
    from deepgp_gi.datasets.uci import load_uci_raw

    tasks = uci.load_sweep(os.path.join(ROOT, "benchmarks", "sweeps", sweep))
    n_splits = {d: load_uci_raw(d)[2] for d in {c["dataset"] for _, c, _ in tasks}}
    assert all(0 <= s < n_splits[c["dataset"]] for _, c, s in tasks)
    # each set's choice reaches ten splits where the set has them (protein has five), and is
    # retrained on the whole training split of each of them
    chosen, refit = {}, {}
    for g, c, s in tasks:
        if "chosen" in g:
            (refit if c["validation"] is None else chosen).setdefault(c["dataset"], set()).add(s)
    assert chosen and all(
        splits == set(range(3, min(10, n_splits[d]))) for d, splits in chosen.items()
    )
    assert refit.keys() == chosen.keys()
    assert all(splits == set(range(min(10, n_splits[d]))) for d, splits in refit.items())
