"""benchmarks/gpu.py on the CPU: a tiny grid end to end (lines, the table, resuming, float32), the
static cost against analytic counts, and the profiler's op counts against a known step."""

import importlib.util
import json
import math

import numpy as np
import pytest
import tensorflow as tf

from benchmarks import gpu as bench
from benchmarks.common import portable

# GPflux is the peer row where the bench extra is installed; `make test` installs only dev
HAS_GPFLUX = importlib.util.find_spec("gpflux") is not None
TINY = [
    "--quick",
    "--batches",
    "256",
    "--Ms",
    "16",
    "--depths",
    "2",
    "--families",
    "mean_field",
    "--rounds",
    "1",
    "--steps-per-round",
    "1",
] + ([] if HAS_GPFLUX else ["--no-gpflux"])
OURS = ["deepgp_gi mean_field", "deepgp_gi mean_field (XLA)"]
PEERS = ["gpflux DSVI", "gpflux DSVI (XLA)"] if HAS_GPFLUX else []


@pytest.mark.slow  # times and profiles four steps, plain and XLA: `make test-all`
def test_tiny_grid_end_to_end(tmp_path):
    md, jsonl = tmp_path / "gpu.md", tmp_path / "gpu.jsonl"
    argv = TINY + ["--profile", "--profile-steps", "2", "--out", str(md)]
    assert bench.main(argv) == 0
    lines = [json.loads(x) for x in jsonl.read_text().splitlines()]
    names = OURS + PEERS
    assert [l["model"] for l in lines] == names
    for l in lines:
        assert l["config"] == dict(batch=256, M=16, depth=2, dtype="float64")
        assert math.isfinite(l["ms_per_step"]) and l["ms_per_step"] > 0
        assert l["flops"] > 0 and l["bytes"] > 0 and l["graph_ops"] > 0
        assert l["unknown_shape_ops"] == {}
        assert l["launches"] > 0
        if l["mode"] == "plain":  # the executor's kernels, with the heavy ones among them
            assert l["executed_ops"] > l["graph_ops"] / 10
            # both layers' K_uu: one batched factorisation for ours, one per layer for GPflux
            assert l["heavy_ops"]["Cholesky"] == (1 if l["family"] == "mean_field" else 2)
            assert l["heavy_ops"]["TriSolve"] >= 2
            assert l["heavy_ops"]["MatMul"] >= 2
    # an XLA step does the same arithmetic as its plain twin, up to safe_cholesky's
    # branch-free retries
    by_name = {l["model"]: l for l in lines}
    if HAS_GPFLUX:
        assert by_name["gpflux DSVI (XLA)"]["flops"] == by_name["gpflux DSVI"]["flops"]
    assert (
        by_name["deepgp_gi mean_field (XLA)"]["flops"] >= by_name["deepgp_gi mean_field"]["flops"]
    )
    table = md.read_text()
    assert f"Device: {bench.device_name()}. TensorFlow {tf.__version__}." in table
    # result files name no folder of this machine: the --out path is written portably
    assert "`" + portable("python benchmarks/gpu.py " + " ".join(argv)) + "`" in table
    assert str(tmp_path) not in table
    for name in names:
        assert f"| 256 | 16 | 2 | {name} | {by_name[name]['ms_per_step']:.2f} |" in table

    # resuming finds every line; a float32 piece adds its own lines and table to the same files
    assert bench.main(argv + ["--resume"]) == 0
    assert len(jsonl.read_text().splitlines()) == len(names)
    tf32_before = tf.config.experimental.tensor_float_32_execution_enabled()
    try:
        assert (
            bench.main(
                TINY
                + ["--modes", "plain", "--float32", "--tf32", "off", "--resume", "--out", str(md)]
            )
            == 0
        )
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(tf32_before)
    lines = [json.loads(x) for x in jsonl.read_text().splitlines()]
    f32 = [l for l in lines if l["config"]["dtype"] == "float32"]
    assert [l["model"] for l in f32] == OURS[:1] + PEERS[:1] and len(lines) == len(names) + len(f32)
    ours = f32[0]
    assert ours["flops"] == pytest.approx(
        lines[0]["flops"], rel=0.01
    )  # the same graph up to the noise conversion
    assert ours["bytes"] == pytest.approx(lines[0]["bytes"] / 2, rel=0.05)
    assert math.isfinite(ours["elbo_float64"]) and 0 < ours["elbo_rel_diff"] < 1e-3
    if HAS_GPFLUX:
        assert "elbo_rel_diff" not in f32[1]
    table = md.read_text()
    assert "## float64" in table and "## float32" in table and "ELBO f32 vs f64 (rel.)" in table
    assert all(l["tf32"] is False for l in f32) and "TensorFloat-32 matmuls (float32" in table
    assert "`--tf32`): off." in table


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--families", "mean_field,sideways"),
        ("--batches", "0"),
        ("--modes", "eager"),
        ("--Ms", "ten"),
        ("--rounds", "-1"),
    ],
)
def test_bad_arguments_name_the_flag(tmp_path, capsys, flag, value):
    with pytest.raises(SystemExit):
        bench.main([flag, value, "--out", str(tmp_path / "x.md")])
    assert f"argument {flag}" in capsys.readouterr().err


@pytest.mark.skipif(HAS_GPFLUX, reason="only where gpflux is missing")
def test_missing_gpflux_is_named_before_any_timing(tmp_path):
    with pytest.raises(SystemExit, match="gpflux is not installed.*--no-gpflux"):
        bench.main(TINY[:-1] + ["--out", str(tmp_path / "x.md")])
    assert not (tmp_path / "x.jsonl").exists()
    assert not (tmp_path / "x.jsonl").exists()


def test_step_cost_counts_known_ops_exactly():
    rng = np.random.default_rng(0)
    a, b = tf.constant(rng.normal(size=(30, 20))), tf.constant(rng.normal(size=(20, 10)))
    c = tf.constant(rng.normal(size=(3, 30, 20)))
    S = rng.normal(size=(4, 12, 12))
    S = tf.constant(S @ np.swapaxes(S, 1, 2) + 12 * np.eye(12))
    R = tf.constant(rng.normal(size=(4, 12, 5)))

    @tf.function
    def nested(S, R):  # called through a StatefulPartitionedCall: followed
        return tf.linalg.triangular_solve(tf.linalg.cholesky(S), R)

    @tf.function
    def step():
        ab = tf.linalg.matmul(a, b)  # [30, 10]
        cb = tf.linalg.matmul(c, b)  # [3, 30, 10]
        x = nested(S, R)  # [4, 12, 5]
        total = tf.reduce_sum(ab)
        skipped = tf.cond(
            tf.reduce_all(ab > 0), lambda: tf.linalg.cholesky(S), lambda: S
        )  # not walked
        return total, cb, x, skipped

    cost = bench.step_cost(step)
    f = cost.flops_by_type
    assert f["MatMul"] == 2 * 30 * 10 * 20
    assert f["BatchMatMulV2"] == 2 * 3 * 30 * 10 * 20
    assert f["Cholesky"] == 4 * 12**3 / 3
    assert f["MatrixTriangularSolve"] == 4 * 12 * 12 * 5
    assert (
        f["Sum"] == 300 and f["Greater"] == 300
    )  # a reduction: per input element; elementwise: per output
    assert f["All"] == 0  # a reduction of booleans: no floating-point work
    assert set(f) == {
        "MatMul",
        "BatchMatMulV2",
        "Cholesky",
        "MatrixTriangularSolve",
        "Sum",
        "Greater",
        "All",
    }
    assert cost.flops == sum(f.values()) and cost.ops == 7
    assert cost.not_followed == {"StatelessIf": 1} and cost.unknown_shape_ops == {}
    doubles = (
        (30 * 20 + 20 * 10 + 30 * 10)
        + (3 * 30 * 20 + 20 * 10 + 3 * 30 * 10)
        + 2 * 4 * 12 * 12
        + (4 * 12 * 12 + 2 * 4 * 12 * 5)
        + (30 * 10 + 1)
        + (30 * 10 + 1)
    )  # Sum's; Greater's: ab and the scalar 0
    bools = 30 * 10 + 30 * 10 + 1  # Greater's output, All's input and output (axes are not data)
    assert cost.bytes == 8 * doubles + bools

    @tf.function
    def dynamic():
        n = tf.random.uniform([], 2, 5, dtype=tf.int32)
        return tf.exp(tf.ones(tf.stack([n, 3]), tf.float64))

    unknown = bench.step_cost(dynamic).unknown_shape_ops
    assert unknown.get("Exp") == 1


def test_executed_ops_counts_the_kernels_of_a_known_step():
    rng = np.random.default_rng(1)
    S = rng.normal(size=(20, 20))
    S = tf.constant(S @ S.T + 20 * np.eye(20))
    B = tf.constant(rng.normal(size=(20, 3)))

    @tf.function
    def step():
        L = tf.linalg.cholesky(S)
        x = tf.linalg.triangular_solve(L, B)
        return tf.linalg.triangular_solve(L, x, adjoint=True)

    executed = bench.executed_ops_per_step(step, steps=3)
    assert executed.by_type["MatrixTriangularSolve"] == 2.0 and executed.by_type["Cholesky"] == 1.0
    assert executed.total >= 3.0 and executed.launches() >= 3.0
    assert bench.heavy_counts(executed.by_type)["TriSolve"] == 2.0
    with pytest.raises(ValueError, match="steps"):
        bench.executed_ops_per_step(step, steps=0)


def test_heavy_groups_and_host_event_names():
    counts = bench.heavy_counts(
        {
            "_MklMatMul": 2.0,
            "BatchMatMulV2": 1.0,
            "_MklBatchMatMulV2": 1.0,
            "Cholesky": 3.0,
            "Transpose": 1.0,
            "_MklTranspose": 2.0,
            "Mul": 9.0,
        }
    )
    assert counts == {"Cholesky": 3.0, "TriSolve": 0.0, "MatMul": 4.0, "Transpose": 3.0}
    assert bench._host_op_type("layer_0/conditional/MatMul:_MklMatMul") == "_MklMatMul"
    for name in (
        "ExecutorState::Process",
        "ThreadpoolListener::StartRegion",
        "ParallelFor",
        "MemoryAllocation",
        "EagerLocalExecute: __inference_step_1",
    ):
        assert bench._host_op_type(name) is None


def test_a_failing_step_is_recorded_not_fatal(tmp_path):
    indefinite = tf.constant([[1.0, 2.0], [2.0, 1.0]], tf.float64)
    ok = tf.constant([[2.0, 1.0], [1.0, 2.0]], tf.float64)

    def factor(A):
        return lambda: tf.function(
            lambda: tf.debugging.check_numerics(tf.linalg.cholesky(A), "the factor")
        )

    steps, failed = bench.build_steps({"bad": factor(indefinite), "good": factor(ok)})
    assert list(steps) == ["good"] and list(failed) == ["bad"]
    assert failed["bad"].startswith("InvalidArgumentError: ")
    line = dict(
        config=dict(batch=8, M=2, depth=2, dtype="float64"),
        model="deepgp_gi global (XLA)",
        family="global",
        mode="xla",
        ms_per_step=None,
        error=failed["bad"],
        device="d",
        tensorflow=tf.__version__,
        command="python benchmarks/gpu.py",
        commit="c",
        rounds=1,
        steps_per_round=1,
    )
    assert "failed: InvalidArgumentError" in bench.summary_row(line)
    bench.write_markdown([line], str(tmp_path / "r.md"))
    table = (tmp_path / "r.md").read_text()
    assert "| 8 | 2 | 2 | deepgp_gi global (XLA) | failed (InvalidArgumentError) | – |" in table
    assert "## Failures" in table


@pytest.mark.slow  # compiles a deep GP step plain and with XLA: `make test-all`
def test_a_failed_factorisation_in_a_model_step_is_a_failure_line():
    """The timed deepgp_gi steps record failed factorisations as fit does (no Assert in the
    step): build_steps reads the record and turns it into a failure, in both modes."""
    import deepgp_gi as dg
    from benchmarks.timing import model_step

    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(16, 2)), rng.normal(size=(16, 1))

    def broken(jit_compile):
        model = dg.build_deep_gp(X, Y, depth=2, posterior="global", num_inducing=4, seed=0)
        for variable in model.layers[0].kernel.trainable_variables:  # K_uu all NaN
            variable.assign(np.full(variable.shape, np.nan))
        return lambda: model_step(model, X, Y, jit_compile)

    def healthy():
        return model_step(
            dg.build_deep_gp(X, Y, depth=2, posterior="global", num_inducing=4, seed=0), X, Y
        )

    steps, failed = bench.build_steps(
        {"plain": broken(False), "xla": broken(True), "good": healthy}
    )
    assert list(steps) == ["good"] and sorted(failed) == ["plain", "xla"]
    assert all(f.startswith("CholeskyError: ") for f in failed.values()), failed


@pytest.mark.slow  # runs and profiles the benchmark twice: `make test-all`
def test_accelerator_branch_counts_one_batched_ladder_per_factorisation(tmp_path):
    """``--accelerator-branch`` traces safe_cholesky as on a GPU: each factorisation and its jitter
    ladder are one batched Cholesky (as many Cholesky kernels as the host branch), the lines say
    which branch they measured, and the library's own branch is restored afterwards."""
    import deepgp_gi as dg

    before = dg.linalg._host_is_the_device
    argv = [
        "--batches",
        "64",
        "--Ms",
        "8",
        "--depths",
        "2",
        "--families",
        "global",
        "--modes",
        "plain",
        "--no-gpflux",
        "--rounds",
        "1",
        "--steps-per-round",
        "1",
        "--profile",
        "--profile-steps",
        "1",
    ]
    lines = {}
    for branch, extra in (("host", []), ("accelerator", ["--accelerator-branch"])):
        md = tmp_path / f"{branch}.md"
        assert bench.main(argv + extra + ["--out", str(md)]) == 0
        (line,) = [json.loads(x) for x in (tmp_path / f"{branch}.jsonl").read_text().splitlines()]
        assert line["cholesky_branch"] == branch
        lines[branch] = line
        assert dg.linalg._host_is_the_device is before
    host, accelerator = (lines[b]["heavy_ops"]["Cholesky"] for b in ("host", "accelerator"))
    # the accelerator branch factorises a matrix and its jitter ladder in one batched Cholesky
    assert host >= 2 and accelerator == host


def test_gpu_kernels_are_counted_by_the_op_that_launched_them():
    """A synthetic GPU plane: two kernels of a Cholesky, one of a MatMul (its op name referenced
    through the stat metadata), one kernel tied to no op, and a memory copy, which is no kernel."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/device:GPU:0")
    plane.stat_metadata[1].name = "kernel_details"
    plane.stat_metadata[2].name = "tf_op"
    plane.stat_metadata[3].name = "layer_1/MatMul:MatMul"  # a referenced string value
    for i, name in enumerate(
        ["potrf_kernel", "potrf_info", "gemm", "fill", "Memcpy HtoD"], start=1
    ):
        plane.event_metadata[i].name = name
    line = plane.lines.add(name="Stream #13(Compute)")
    for meta, op in [
        (1, "layer_0/Cholesky:Cholesky"),
        (2, "layer_0/Cholesky:Cholesky"),
        (3, 3),
        (4, None),
        (5, None),
    ]:
        event = line.events.add(metadata_id=meta)
        if meta != 5:
            event.stats.add(metadata_id=1, str_value="regs:32")
        if isinstance(op, str):
            event.stats.add(metadata_id=2, str_value=op)
        elif op is not None:
            event.stats.add(metadata_id=2, ref_value=op)
    executed = bench.count_executed([space], steps=2)
    assert executed.gpu_kernels == 2.0  # 4 kernels over 2 steps; the copy is not one
    assert executed.gpu_by_type == {"Cholesky": 1.0, "MatMul": 0.5, "(no op)": 0.5}
    line = dict(
        config=dict(batch=10, M=5, depth=2, dtype="float64"),
        model="deepgp_gi mean_field",
        gpu_kernels=executed.gpu_kernels,
        gpu_by_type=executed.gpu_by_type,
    )
    table = "\n".join(bench._gpu_kernel_sources([line]))
    assert (
        "| 10 | float64 | deepgp_gi mean_field | 2 | Cholesky 1, MatMul 0.5, (no op) 0.5 |" in table
    )
