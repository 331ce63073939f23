"""Per-step cost of every deep-GP family, plain and XLA-compiled, next to GPflux's DSVI deep GP.

Made for an accelerator and correct on a CPU-only machine. For every configuration (batch size,
number of inducing points M, depth) it times one compiled Adam step (ELBO, gradient, update; one
Monte Carlo sample; kin8nm inputs tiled to the batch size) of

* every deep-GP family in :data:`deepgp_gi.families.DEEP_GP_FAMILIES`, plain ``tf.function`` and
  XLA (``jit_compile=True``), built by ``benchmarks/timing.py``'s helpers;
* GPflux's DSVI deep GP at the same configuration, plain and XLA;

alternating the models round by round in one process (as ``speed.py`` does) and keeping the
median. Beside each time it records what one step asks of the machine:

* ``step_cost``: floating-point operations and memory traffic (bytes read and written by every
  op) of one step, estimated from the traced graph and its static shapes (see :func:`step_cost`);
* with ``--profile``, ``executed_ops_per_step``: how many TensorFlow kernels (op executions) one
  step runs, by op type, read from a profiler trace, and on a GPU how many device kernels it
  launches (see :func:`executed_ops_per_step`);
* with ``--float32``, the whole table in float32, and for each family the float32 ELBO against
  the float64 ELBO of the same model on the same data and the same seeded noise.

Outputs: a markdown table (default ``benchmarks/results/gpu.md``, ``--out``) headed by the
device (the GPU's name when one is visible, else the CPU model and "CPU only"), the TensorFlow
version and the commands that produced it; and a jsonl beside it (``--jsonl``; default: the
markdown path with ``.jsonl``), one line per configuration and model, appended as each
configuration finishes. ``--resume`` skips the (configuration, model) pairs already there; without
it the jsonl starts afresh. A model whose step fails to run (out of device memory, a failed XLA
compilation) gets a line with the error instead of a time, and the others go on; ``--resume``
counts that line as done (delete it to try again). The grid is large (3 batch sizes x 2 M x
3 depths x 12 models, each configuration's models held at once), so run it in pieces, each with
``--resume``::

    python benchmarks/gpu.py --quick                                  # smoke test
    python benchmarks/gpu.py --profile --batches 1000 --Ms 100        # one slice of the grid
    python benchmarks/gpu.py --profile --resume --batches 10000 --families mean_field,global
    python benchmarks/gpu.py --float32 --profile --resume --depths 3  # float32 lines, same files
"""

from __future__ import annotations

if not __package__:  # run by path: load benchmarks/ as the package (benchmarks/_by_path.py)
    import _by_path  # noqa: F401  (imported for its side effect)

import argparse
import collections
import contextlib
import glob
import importlib.util
import json
import math
import os
import platform
import shlex
import sys
import tempfile
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Tuple

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gpflow
import numpy as np
import tensorflow as tf

import deepgp_gi as dg
from benchmarks.common import append_line, code_commit, read_lines
from benchmarks.timing import (
    fit_step,
    gpflux_dsvi,
    kin8nm_inputs,
    ours,
    raise_if_step_failed,
    time_models,
)
from deepgp_gi.families import DEEP_GP_FAMILIES

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
DEFAULT_OUT = os.path.join(RESULTS, "gpu.md")
BATCHES = (1000, 10000, 100000)
MS = (100, 500)
DEPTHS = (2, 3, 5)
QUICK = dict(batches=(1000,), Ms=(100,), depths=(3,), rounds=3, steps_per_round=3)
MODES = ("plain", "xla")
GPFLUX = "gpflux DSVI"
ELBO_SEED = (0, 7)  # the seeded noise of the float32-against-float64 ELBO comparison


# --------------------------------------------------------------------------- static cost
#: Ops that only relabel or describe a buffer (or are bookkeeping): no flops, no traffic.
FREE_OPS = frozenset(
    {
        "Const",
        "HostConst",
        "Placeholder",
        "PlaceholderWithDefault",
        "_Arg",
        "_Retval",
        "NoOp",
        "Identity",
        "IdentityN",
        "Reshape",
        "Squeeze",
        "ExpandDims",
        "Shape",
        "ShapeN",
        "Size",
        "Rank",
        "StopGradient",
        "PreventGradient",
        "ReadVariableOp",
        "VarHandleOp",
        "VarIsInitializedOp",
        "Snapshot",
        "EnsureShape",
        "Bitcast",
        "Assert",
        "Print",
        "PrintV2",
        "StringFormat",
        "BroadcastGradientArgs",
        "BroadcastArgs",
    }
)
#: Ops that move or rearrange data without arithmetic: traffic, no flops.
MOVEMENT_OPS = frozenset(
    {
        "Transpose",
        "ConjugateTranspose",
        "ConcatV2",
        "Concat",
        "Pack",
        "Unpack",
        "Slice",
        "StridedSlice",
        "StridedSliceGrad",
        "GatherV2",
        "GatherNd",
        "ResourceGather",
        "ScatterNd",
        "TensorScatterUpdate",
        "Tile",
        "BroadcastTo",
        "Pad",
        "PadV2",
        "MirrorPad",
        "MatrixBandPart",
        "MatrixDiag",
        "MatrixDiagV2",
        "MatrixDiagV3",
        "MatrixDiagPart",
        "MatrixDiagPartV2",
        "MatrixDiagPartV3",
        "MatrixSetDiag",
        "MatrixSetDiagV2",
        "MatrixSetDiagV3",
        "Fill",
        "ZerosLike",
        "OnesLike",
        "ReverseV2",
        "Split",
        "SplitV",
        "Range",
        "OneHot",
        "Cast",
        "Where",
        "Roll",
        "DynamicStitch",
        "ParallelDynamicStitch",
        "AssignVariableOp",
        "CheckNumerics",
        "CheckNumericsV2",
    }
)
#: One flop per input element (of the first input).
REDUCTION_OPS = frozenset(
    {
        "Sum",
        "Prod",
        "Mean",
        "Max",
        "Min",
        "All",
        "Any",
        "ArgMax",
        "ArgMin",
        "EuclideanNorm",
        "Cumsum",
        "Cumprod",
        "CumulativeLogsumexp",
        "BiasAddGrad",
        "L2Loss",
        "UnsortedSegmentSum",
        "SegmentSum",
    }
)
MATMUL_OPS = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"})
#: Function calls: the called function's ops are counted in their place.
CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
#: Control flow whose branches or bodies are not walked (counted in ``not_followed``).
CONTROL_FLOW_OPS = frozenset(
    {"If", "StatelessIf", "While", "StatelessWhile", "Case", "StatelessCase"}
)
#: Dense linear algebra without a flop rule here (counted in ``uncosted``, never as elementwise).
UNCOSTED_OPS = frozenset(
    {
        "Qr",
        "Svd",
        "SelfAdjointEigV2",
        "Eig",
        "Lu",
        "MatrixExponential",
        "MatrixLogarithm",
        "MatrixSquareRoot",
        "MatrixSolveLs",
        "TridiagonalSolve",
    }
)
_NO_DATA = (tf.resource, tf.variant, tf.string)


class StepCost(NamedTuple):
    """Static cost of one call of a compiled step (see :func:`step_cost`).

    ``flops``: floating-point operations; ``bytes``: memory traffic, the bytes of the
    inputs and outputs of every op; ``flops_by_type``: flops per op type; ``ops``: the ops costed
    (free ops and function calls excluded); ``unknown_shape_ops``: op type -> number of ops left
    out because a tensor's static shape was unknown; ``not_followed``: control-flow op type ->
    number of ops whose branches or bodies were not walked; ``uncosted``: op type -> ops without a
    flop rule (their traffic is counted).
    """

    flops: float
    bytes: float
    flops_by_type: Dict[str, float]
    ops: int
    unknown_shape_ops: Dict[str, int]
    not_followed: Dict[str, int]
    uncosted: Dict[str, int]


def _num_elements(shape: tf.TensorShape) -> Optional[int]:
    """Number of elements of a static shape, or None when any dimension is unknown."""
    if shape.rank is None or any(d is None for d in shape.as_list()):
        return None
    return int(np.prod(shape.as_list(), dtype=np.int64))


def _einsum_flops(op) -> Optional[float]:
    """``2 * (output elements) * (sizes of the contracted indices)`` for two operands, the input
    elements for one; None when a needed size is unknown."""
    equation = op.get_attr("equation").decode().replace(" ", "")
    inputs, _, output = equation.partition("->")
    out_elements = _num_elements(op.outputs[0].shape)
    if out_elements is None:
        return None
    terms = inputs.split(",")
    if len(terms) == 1:
        return _num_elements(op.inputs[0].shape)
    sizes = {}
    for term, tensor in zip(terms, op.inputs):
        dims = tensor.shape.as_list()
        letters = term.replace("...", "")
        for letter, size in zip(letters, dims[len(dims) - len(letters) :]):
            sizes[letter] = size
    contracted = [sizes.get(c) for c in set(inputs.replace(",", "").replace(".", "")) - set(output)]
    if any(s is None for s in contracted):
        return None
    return 2.0 * out_elements * float(np.prod(contracted))


def _floating(op) -> bool:
    """Whether ``op`` reads or writes floating-point (or complex) data."""
    return any(
        t.dtype.is_floating or t.dtype.is_complex for t in list(op.inputs) + list(op.outputs)
    )


#: ``(numerator, denominator)`` of the ``b n^3`` flops of the square-matrix factorisations.
_CUBIC = {
    "Cholesky": (1, 3),
    "MatrixInverse": (2, 1),
    "MatrixDeterminant": (2, 3),
    "LogMatrixDeterminant": (2, 3),
}


def _op_flops(op) -> Optional[float]:
    """Floating-point operations of one op from its static shapes (None when a needed shape is
    unknown).

    MatMul / BatchMatMul: ``2 b m n k``; Einsum: see :func:`_einsum_flops`; Cholesky: ``b n^3 / 3``;
    MatrixTriangularSolve: ``b n^2 k``; MatrixSolve: ``b (2 n^3 / 3 + 2 n^2 k)``; MatrixInverse:
    ``2 b n^3``; (Log)MatrixDeterminant: ``2 b n^3 / 3``; reductions: one per input element; data
    movement: none; anything else is elementwise: one per output element (for an op without
    outputs, such as AssignAddVariableOp, one per element of its largest input). Reductions and
    elementwise ops on integers or booleans only (the noise's hashing, shape arithmetic, masks)
    do no floating-point work: 0.
    """
    kind = op.type
    if kind in MOVEMENT_OPS or kind in UNCOSTED_OPS:
        return 0.0
    if kind in REDUCTION_OPS:
        n = _num_elements(op.inputs[0].shape)
        return None if n is None else float(n) * _floating(op)
    if kind == "Einsum":
        return _einsum_flops(op)
    if kind in MATMUL_OPS:
        out = _num_elements(op.outputs[0].shape)
        a = op.inputs[0].shape
        if out is None or a.rank is None:
            return None
        transposed = op.get_attr("transpose_a") if kind == "MatMul" else op.get_attr("adj_x")
        k = a[-2] if transposed else a[-1]
        return None if k is None else 2.0 * out * k
    if kind in _CUBIC:
        a = op.inputs[0].shape
        n_all = _num_elements(a)
        if n_all is None:
            return None
        numerator, denominator = _CUBIC[kind]
        return n_all * a[-1] * numerator / denominator  # b n^2 elements times n
    if kind == "MatrixTriangularSolve":
        out, n = _num_elements(op.outputs[0].shape), op.inputs[0].shape[-1]
        return None if out is None or n is None else float(out) * n
    if kind == "MatrixSolve":
        out, a = _num_elements(op.outputs[0].shape), op.inputs[0].shape
        n_all = _num_elements(a)
        if out is None or n_all is None:
            return None
        return 2.0 * n_all * a[-1] / 3.0 + 2.0 * out * a[-1]
    sizes = [_num_elements(t.shape) for t in (op.outputs or op.inputs) if t.dtype not in _NO_DATA]
    if any(s is None for s in sizes):
        return None
    return float(max(sizes, default=0)) * _floating(op)


def _op_bytes(op) -> Optional[float]:
    """Bytes of every input and output of ``op`` (handles excluded; of a reduction's inputs only
    the data, not the axes, whose length is often known only at run time), None when a shape is
    unknown."""
    inputs = list(op.inputs)[:1] if op.type in REDUCTION_OPS else list(op.inputs)
    total = 0.0
    for tensor in inputs + list(op.outputs):
        if tensor.dtype in _NO_DATA:
            continue
        n = _num_elements(tensor.shape)
        if n is None:
            return None
        total += n * tensor.dtype.size
    return total


def _called_function(op):
    """The function graph ``op`` calls (a PartitionedCall's ``f``, or an op named after a library
    function), looked up in its graph and the graphs it is nested in; None if not found."""
    name = op.get_attr("f").name if op.type in CALL_OPS else op.type
    graph = op.graph
    while graph is not None:
        found = graph._get_function(name)  # the function library of this graph
        if found is not None:
            return getattr(found, "graph", None)
        graph = getattr(graph, "outer_graph", None)
    return None


def _walk(graph, totals: dict) -> None:
    for op in graph.get_operations():
        if op.type in FREE_OPS:
            continue
        if op.type in CONTROL_FLOW_OPS:
            totals["not_followed"][op.type] += 1
            continue
        if op.type in CALL_OPS or graph._get_function(op.type) is not None:
            inner = _called_function(op)
            if inner is None:
                totals["unknown_shape_ops"][op.type] += 1
            else:
                _walk(inner, totals)
            continue
        flops, traffic = _op_flops(op), _op_bytes(op)
        if flops is None or traffic is None:
            totals["unknown_shape_ops"][op.type] += 1
            continue
        if op.type in UNCOSTED_OPS:
            totals["uncosted"][op.type] += 1
        totals["flops_by_type"][op.type] += flops
        totals["bytes"] += traffic
        totals["ops"] += 1


def step_cost(step) -> StepCost:
    """Static flops and memory traffic of one call of ``step``, a ``tf.function`` taking no
    arguments (such as the steps of ``benchmarks/timing.py``).

    Walks ``step.get_concrete_function().graph`` (traced once if needed) op by op, using each
    tensor's static shape, and follows the functions called through ``PartitionedCall`` /
    ``StatefulPartitionedCall`` (nested ``tf.function`` calls and their gradients; each call
    counted where it happens; a call whose function is not found counts as an unknown-shape op). The
    branches and bodies of ``If`` / ``StatelessIf`` / ``While`` / ``Case`` are not walked: in this
    library they hold the jitter-escalation retries of ``safe_cholesky``, which run only when a
    factorisation fails; they are counted in ``not_followed``. (Traced with a GPU visible or under
    ``accelerator_branch()``, plain or XLA, ``safe_cholesky`` retries without control flow, so its
    stand-in refactorisations are part of the graph and counted in full.)

    Rules per op (see :func:`_op_flops`): matmul ``2 b m n k``, Cholesky ``b n^3 / 3``, triangular
    solve ``b n^2 k``, elementwise ops one flop per output element, reductions one per input
    element (both only on floating-point data), data movement none; traffic is the bytes of each
    op's inputs plus outputs (dtype size times elements). Ops that only relabel a buffer (Identity,
    Reshape, ReadVariableOp, Const, Shape, ...; :data:`FREE_OPS`) cost nothing. The counts describe
    the graph as traced, before Grappler or XLA fuse or drop anything, so traffic is an upper bound
    of what a fusing compiler moves.

    :param step: a ``tf.function`` with no arguments.
    :return: a :class:`StepCost`; ops whose shapes are unknown are counted in
        ``unknown_shape_ops``, not silently dropped.
    """
    graph = step.get_concrete_function().graph
    totals = dict(
        flops_by_type=collections.Counter(),
        bytes=0.0,
        ops=0,
        unknown_shape_ops=collections.Counter(),
        not_followed=collections.Counter(),
        uncosted=collections.Counter(),
    )
    _walk(graph, totals)
    by_type = dict(totals["flops_by_type"])
    return StepCost(
        flops=float(sum(by_type.values())),
        bytes=totals["bytes"],
        flops_by_type=by_type,
        ops=totals["ops"],
        unknown_shape_ops=dict(totals["unknown_shape_ops"]),
        not_followed=dict(totals["not_followed"]),
        uncosted=dict(totals["uncosted"]),
    )


# --------------------------------------------------------------------------- executed ops
#: Host events that are executor or thread-pool bookkeeping, not kernels.
_HOST_SKIP = ("Thread", "ExecutorState", "Memory", "ParallelFor")
#: Derived timelines the profiler adds to a device plane (aggregates, not kernel launches).
_DERIVED_LINES = (
    "Steps",
    "XLA Modules",
    "XLA Ops",
    "XLA TraceMe",
    "TensorFlow Ops",
    "TensorFlow Name Scope",
    "Framework Ops",
    "Framework Name Scope",
    "Launch Stats",
    "Source",
)


class ExecutedOps(NamedTuple):
    """Kernels one call of a step executes (see :func:`executed_ops_per_step`).

    ``by_type``: TensorFlow op type -> executions per step; ``total``: their sum; ``gpu_kernels``:
    device kernel launches per step on the GPUs (None when the trace has no GPU plane);
    ``xla_cpu_thunks``: thunks (fused kernels, loops' bodies once per iteration) XLA's CPU
    backend executes per step (None when there are none: no XLA on the host); ``gpu_by_type``:
    the GPU launches per step by the TensorFlow op type that launched them (``"(no op)"`` for a
    kernel the trace ties to no op; None without a GPU plane).
    """

    by_type: Dict[str, float]
    total: float
    gpu_kernels: Optional[float]
    xla_cpu_thunks: Optional[float]
    gpu_by_type: Optional[Dict[str, float]] = None

    def launches(self) -> float:
        """Kernels per step as the hardware sees them: GPU launches, else XLA CPU thunks,
        else ops."""
        for value in (self.gpu_kernels, self.xla_cpu_thunks):
            if value:
                return value
        return self.total


def _host_op_type(name: str) -> Optional[str]:
    """The op type of a host event named ``"<node name>:<OpType>"``, else None."""
    if name.startswith(_HOST_SKIP) or "::" in name:
        return None
    node, sep, op_type = name.rpartition(":")
    if not sep or not node or not op_type.isidentifier():
        return None
    return op_type


def _host_ops(plane) -> collections.Counter:
    counts = collections.Counter()
    for line in plane.lines:
        if not line.name.startswith("tf_Compute"):
            continue
        for event in line.events:
            op_type = _host_op_type(plane.event_metadata[event.metadata_id].name)
            if op_type is not None:
                counts[op_type] += 1
    return counts


def _xla_cpu_thunks(plane) -> int:
    """XLA CPU thunk executions on the host plane: events named ``X`` for which the plane also
    has ``"end: X"`` events (how XLA's CPU runtime marks each thunk it runs)."""
    names = [plane.event_metadata[e.metadata_id].name for line in plane.lines for e in line.events]
    ended = {n[len("end: ") :] for n in names if n.startswith("end: ")}
    return sum(1 for n in names if n in ended)


def _gpu_kernel_events(plane) -> List:
    """The kernel launches on a ``/device:GPU:N`` plane: events carrying the ``kernel_details``
    stat on its stream lines; when no event carries it, every event on the stream lines except
    memory copies and sets."""
    kernel_stat = {i for i, m in plane.stat_metadata.items() if m.name == "kernel_details"}
    raw = [
        line
        for line in plane.lines
        if (line.name.startswith("Stream") or line.name == "Kernels")
        and not line.name.startswith(_DERIVED_LINES)
    ]
    events = [e for line in raw for e in line.events]
    if kernel_stat and any(s.metadata_id in kernel_stat for e in events for s in e.stats):
        return [e for e in events if any(s.metadata_id in kernel_stat for s in e.stats)]
    return [
        e
        for e in events
        if not plane.event_metadata[e.metadata_id].name.startswith(
            ("Memcpy", "Memset", "memcpy", "memset")
        )
    ]


def _gpu_kernels(plane) -> int:
    """Kernel launches on a ``/device:GPU:N`` plane (see :func:`_gpu_kernel_events`)."""
    return len(_gpu_kernel_events(plane))


def _stat_text(plane, stat) -> Optional[str]:
    """A stat's string value: inline, or through a reference into the plane's stat metadata."""
    which = stat.WhichOneof("value")
    if which == "str_value":
        return stat.str_value
    if which == "ref_value" and stat.ref_value in plane.stat_metadata:
        return plane.stat_metadata[stat.ref_value].name
    return None


def _gpu_kernels_by_op(plane) -> collections.Counter:
    """The kernel launches on a GPU plane by the TensorFlow op type that launched them: the
    ``tf_op`` stat of each kernel event (``"<node name>:<OpType>"``), ``"(no op)"`` without one."""
    tf_op = {i for i, m in plane.stat_metadata.items() if m.name == "tf_op"}
    counts = collections.Counter()
    for event in _gpu_kernel_events(plane):
        texts = [_stat_text(plane, s) for s in event.stats if s.metadata_id in tf_op]
        op = next((t for t in texts if t), None)
        counts[op.rpartition(":")[2] or op if op else "(no op)"] += 1
    return counts


def count_executed(spaces: Iterable, steps: int) -> ExecutedOps:
    """Per-step kernel counts from the profiler's ``XSpace`` protos of ``steps`` calls."""
    host, gpu_ops, saw_gpu, thunks = collections.Counter(), collections.Counter(), False, 0
    for space in spaces:
        for plane in space.planes:
            if plane.name == "/host:CPU":
                host.update(_host_ops(plane))
                thunks += _xla_cpu_thunks(plane)
            elif plane.name.startswith("/device:GPU:"):
                saw_gpu = True
                gpu_ops.update(_gpu_kernels_by_op(plane))
    by_type = {k: v / steps for k, v in sorted(host.items())}
    gpu_by_type = {k: v / steps for k, v in gpu_ops.most_common()} if saw_gpu else None
    return ExecutedOps(
        by_type=by_type,
        total=float(sum(host.values())) / steps,
        gpu_kernels=float(sum(gpu_ops.values())) / steps if saw_gpu else None,
        xla_cpu_thunks=thunks / steps if thunks else None,
        gpu_by_type=gpu_by_type,
    )


def _read_xspaces(logdir: str) -> List:
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    spaces = []
    for path in sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)):
        space = xplane_pb2.XSpace()
        with open(path, "rb") as fh:
            space.ParseFromString(fh.read())
        spaces.append(space)
    if not spaces:
        raise RuntimeError(f"the profiler wrote no *.xplane.pb under {logdir}")
    return spaces


def executed_ops_per_step(step: Callable[[], tf.Tensor], steps: int = 4) -> ExecutedOps:
    """Kernels one call of ``step`` executes, by op type, read from a profiler trace.

    ``step`` (a ``tf.function`` with no arguments) is called once untraced (tracing and XLA
    compilation stay out of the trace), then ``steps`` times under
    ``tf.profiler.experimental.start/stop`` into a temporary directory, waiting for each result.
    The trace's ``*.xplane.pb`` files are read as ``XSpace`` protos: on the ``/host:CPU`` plane,
    each event named ``"<node name>:<OpType>"`` on a ``tf_Compute*`` line is one executed kernel
    (executor and thread-pool events are skipped); on a ``/device:GPU:N`` plane each kernel event
    on a stream line is one device launch; XLA's CPU thunks are counted apart (see
    :func:`_xla_cpu_thunks`). Counts are divided by ``steps``. An XLA-compiled step runs as one
    function op outside the ``tf_Compute`` threads, so its ``total`` is 0: its work is in
    ``xla_cpu_thunks`` on a CPU and ``gpu_kernels`` on a GPU.

    :param step: a ``tf.function`` with no arguments (it runs ``steps + 1`` times).
    :param steps: profiled calls, a positive int.
    :return: an :class:`ExecutedOps`.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    _wait(step())
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            for _ in range(steps):
                _wait(step())
        finally:
            tf.profiler.experimental.stop()
        return count_executed(_read_xspaces(logdir), steps)


def _wait(result) -> None:
    for tensor in tf.nest.flatten(result):
        np.asarray(tensor)


#: Columns of the report: a label and the op types (plain, oneDNN ``_Mkl`` and fused variants).
HEAVY = (
    ("Cholesky", ("Cholesky",)),
    ("TriSolve", ("MatrixTriangularSolve",)),
    (
        "MatMul",
        ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "FusedMatMul", "Einsum"),
    ),
    ("Transpose", ("Transpose", "ConjugateTranspose")),
)


def _base_type(op_type: str) -> str:
    for prefix in ("_MklNative", "_Mkl", "_"):
        if op_type.startswith(prefix):
            return op_type[len(prefix) :]
    return op_type


def heavy_counts(by_type: Dict[str, float]) -> Dict[str, float]:
    """Per-step counts of the heavy op groups of :data:`HEAVY`, ``_Mkl`` variants included."""
    out = {label: 0.0 for label, _ in HEAVY}
    for op_type, n in by_type.items():
        for label, members in HEAVY:
            if _base_type(op_type) in members:
                out[label] += n
    return out


# --------------------------------------------------------------------------- device, precision
def device_name() -> str:
    """The GPU's name (and compute capability) when one is visible, else the CPU model,
    "CPU only"."""
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        name = details.get("device_name", gpus[0].name)
        cc = details.get("compute_capability")
        extra = f" (compute capability {cc[0]}.{cc[1]})" if cc else ""
        return f"{name}{extra}" + (
            f", {len(gpus)} GPUs visible, GPU:0 used" if len(gpus) > 1 else ""
        )
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, CPU only"


def precision(dtype: str):
    """GPflow's configuration for a run in ``dtype`` ("float64" or "float32") as a context."""
    if dtype == "float64":
        return gpflow.config.as_context(gpflow.config.Config(float=np.float64, jitter=1e-6))
    return gpflow.config.as_context(gpflow.config.Config(float=np.float32, jitter=1e-5))


# --------------------------------------------------------------------------- models
def model_names(
    families: Tuple[str, ...], modes: Tuple[str, ...], gpflux: bool = True
) -> List[str]:
    """Row names of one configuration: each family in each mode, then (if ``gpflux``) GPflux in
    each mode."""

    def named(base, mode):
        return base if mode == "plain" else f"{base} (XLA)"

    peers = [named(GPFLUX, m) for m in modes] if gpflux else []
    return [named(f"deepgp_gi {f}", m) for f in families for m in modes] + peers


def _parse_name(name: str) -> Tuple[Optional[str], str]:
    """(family or None for GPflux, mode) of a row name."""
    mode = "xla" if name.endswith(" (XLA)") else "plain"
    base = name[: -len(" (XLA)")] if mode == "xla" else name
    return (None if base == GPFLUX else base[len("deepgp_gi ") :]), mode


def makers_for(X, Y, depth: int, M: int, names: List[str]) -> Dict[str, Callable]:
    """``{row name: () -> compiled step}`` for the rows ``names`` on data ``X [N, D]``,
    ``Y [N, 1]``."""
    makers = {}
    for name in names:
        family, mode = _parse_name(name)
        jit = mode == "xla"
        if family is None:
            makers[name] = lambda jit=jit: gpflux_dsvi(X, Y, depth, M, jit_compile=jit)
        else:
            makers[name] = lambda f=family, jit=jit: family_step(X, Y, depth, f, M, jit)
    return makers


def family_step(X, Y, depth: int, family: str, M: int, jit_compile: bool):
    """A family's compiled step: ``timing.ours`` (Adam on the ELBO), or for a sampling family, which
    has no ELBO, ``fit``'s own step (``timing.fit_step``: an SGHMC move and an Adam step)."""
    import deepgp_gi as dg

    if getattr(dg.families.DEEP_GP_FAMILIES[family], "is_sampler", False):
        model = dg.build_deep_gp(X, Y, depth=depth, posterior=family, num_inducing=M, seed=0)
        return fit_step(model, X, Y, jit_compile)
    return ours(X, Y, depth, family, M, jit_compile=jit_compile)


def elbo_float32_vs_float64(X, Y, depth: int, M: int, family: str) -> Dict[str, float]:
    """The float64 and float32 ELBO of one model (seed 0) on the same data and seeded noise.

    The float32 model is built from the float32 data and then given the float64 model's
    parameter values, so both evaluate the same parameters; the noise is
    ``SeededNoise(ELBO_SEED)`` (the same Philox words; float32 keeps 24 bits of each).
    """
    with precision("float64"):
        m64 = dg.build_deep_gp(X, Y, depth=depth, posterior=family, num_inducing=M, seed=0)
        e64 = float(
            m64.elbo(
                (tf.constant(X), tf.constant(Y)), 1, seed=dg.noise.SeededNoise(list(ELBO_SEED))
            )
        )
        values = {k: v.numpy() for k, v in gpflow.utilities.parameter_dict(m64).items()}
    with precision("float32"):
        X32, Y32 = X.astype(np.float32), Y.astype(np.float32)
        m32 = dg.build_deep_gp(X32, Y32, depth=depth, posterior=family, num_inducing=M, seed=0)
        params = gpflow.utilities.parameter_dict(m32)
        if set(params) != set(values):
            raise RuntimeError(
                f"{family}: the float32 and float64 models have different parameters"
            )
        gpflow.utilities.multiple_assign(m32, {k: v.astype(np.float32) for k, v in values.items()})
        e32 = float(
            m32.elbo(
                (tf.constant(X32), tf.constant(Y32)), 1, seed=dg.noise.SeededNoise(list(ELBO_SEED))
            )
        )
    return dict(elbo_float64=e64, elbo_float32=e32, elbo_rel_diff=abs(e32 - e64) / abs(e64))


# --------------------------------------------------------------------------- runs
def _line_key(config: dict, model: str) -> str:
    return json.dumps([config, model], sort_keys=True)


def _failure(error: Exception) -> str:
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first[:300]}"


def build_steps(makers: Dict[str, Callable]) -> Tuple[Dict[str, Callable], Dict[str, str]]:
    """``({name: step}, {name: failure})``: each maker called and its step run once (traced and
    compiled); a TensorFlow error there (out of device memory, a failed XLA compilation, a failed
    factorisation) is recorded for that model instead of ending the run."""
    steps, failed = {}, {}
    for name, make in makers.items():
        try:
            step = make()
            _wait(step())
            raise_if_step_failed(step)
        except tf.errors.OpError as error:
            failed[name] = _failure(error)
        else:
            steps[name] = step
    return steps, failed


def measure(step, ms_per_step: float, profile_steps: Optional[int]) -> dict:
    """The jsonl fields of one timed step: its static cost and, if ``profile_steps``,
    its kernels."""
    cost = step_cost(step)
    out = dict(
        ms_per_step=ms_per_step,
        flops=cost.flops,
        bytes=cost.bytes,
        graph_ops=cost.ops,
        flops_by_type=cost.flops_by_type,
        unknown_shape_ops=cost.unknown_shape_ops,
        not_followed=cost.not_followed,
        uncosted=cost.uncosted,
    )
    if profile_steps:
        executed = executed_ops_per_step(step, profile_steps)
        out.update(
            executed_ops=executed.total,
            executed_by_type=executed.by_type,
            heavy_ops=heavy_counts(executed.by_type),
            gpu_kernels=executed.gpu_kernels,
            xla_cpu_thunks=executed.xla_cpu_thunks,
            launches=executed.launches(),
            gpu_by_type=executed.gpu_by_type,
        )
    return out


def run_config(config: dict, names: List[str], args, header: dict) -> List[dict]:
    """The jsonl lines of the rows ``names`` of one configuration: built, timed round by round,
    costed and (with ``--profile``) profiled; float32 lines of a family carry the ELBO check."""
    dtype = config["dtype"]
    X, Y = kin8nm_inputs(config["batch"])
    if dtype == "float32":
        X, Y = X.astype(np.float32), Y.astype(np.float32)
    lines, elbos = [], {}
    with precision(dtype):
        steps, failed = build_steps(makers_for(X, Y, config["depth"], config["M"], names))
        makers = {name: (lambda step=step: step) for name, step in steps.items()}
        times = (
            time_models(makers, args.rounds, args.steps_per_round, check_failures=False)
            if makers
            else {}
        )
        for name, step in steps.items():  # a factorisation that failed while timed: a failure line
            try:
                raise_if_step_failed(step)
            except tf.errors.OpError as error:
                failed[name] = _failure(error)
        for name in names:
            family, mode = _parse_name(name)
            line = dict(config=config, model=name, family=family or GPFLUX, mode=mode, **header)
            if name in failed:
                line.update(ms_per_step=None, error=failed[name])
            else:
                line.update(
                    measure(steps[name], times[name], args.profile_steps if args.profile else None)
                )
            if dtype == "float32" and family is not None:
                if family not in elbos:
                    elbos[family] = _elbo_check(
                        X.astype(np.float64), Y.astype(np.float64), config, family
                    )
                line.update(elbos[family])
            lines.append(line)
    return lines


def _elbo_check(X, Y, config: dict, family: str) -> dict:
    try:
        return elbo_float32_vs_float64(X, Y, config["depth"], config["M"], family)
    except tf.errors.OpError as error:
        return dict(elbo_error=_failure(error))


def _csv(kind: Callable, choices: Optional[Tuple[str, ...]] = None):
    """An argparse type: a comma-separated list of ``kind`` values (each in ``choices``
    if given)."""

    def parse(text: str):
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected a comma-separated list, got nothing")
        out = []
        for item in items:
            if choices is not None and item not in choices:
                raise argparse.ArgumentTypeError(
                    f"unknown value {item!r}; choose from {', '.join(choices)}"
                )
            try:
                value = kind(item)
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"{item!r} is not a valid {kind.__name__}"
                ) from None
            if kind is int and value < 1:
                raise argparse.ArgumentTypeError(f"{item!r} must be a positive integer")
            out.append(value)
        return tuple(dict.fromkeys(out))

    return parse


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive integer")
    return value


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: batch 1000, M 100, depth 3 (unless given), 3 rounds of 3 steps",
    )
    parser.add_argument(
        "--batches", type=_csv(int), help=f"batch sizes (default {','.join(map(str, BATCHES))})"
    )
    parser.add_argument(
        "--Ms", type=_csv(int), help=f"inducing points per layer (default {','.join(map(str, MS))})"
    )
    parser.add_argument(
        "--depths", type=_csv(int), help=f"depths (default {','.join(map(str, DEPTHS))})"
    )
    parser.add_argument(
        "--families",
        type=_csv(str, tuple(DEEP_GP_FAMILIES)),
        default=tuple(DEEP_GP_FAMILIES),
        help="deep-GP families (default all); GPflux is a row unless --no-gpflux",
    )
    parser.add_argument(
        "--no-gpflux",
        action="store_true",
        help="leave out the GPflux rows (for an environment without the bench extra)",
    )
    parser.add_argument(
        "--modes", type=_csv(str, MODES), default=MODES, help="plain, xla (default both)"
    )
    parser.add_argument(
        "--rounds", type=_positive_int, help="timing rounds (default 7; 3 with --quick)"
    )
    parser.add_argument(
        "--steps-per-round", type=_positive_int, help="steps per round (default 10; 3 with --quick)"
    )
    parser.add_argument(
        "--float32",
        action="store_true",
        help="run in float32 (lines marked float32) and compare each family's ELBO with float64",
    )
    parser.add_argument(
        "--tf32",
        choices=("on", "off"),
        default=None,
        help="TensorFloat-32 for float32 matmuls on Ampere and newer GPUs (default: TensorFlow's, "
        "on); recorded in every line",
    )
    parser.add_argument(
        "--accelerator-branch",
        action="store_true",
        help="trace safe_cholesky's GPU branch (branch-free jitter ladder) even with no GPU: "
        "counts on a CPU the ops a GPU step runs; recorded in every line",
    )
    parser.add_argument(
        "--profile", action="store_true", help="count the executed ops of each step (profiler)"
    )
    parser.add_argument(
        "--profile-steps",
        type=_positive_int,
        default=4,
        help="steps profiled per model (default 4)",
    )
    parser.add_argument(
        "--out", default=DEFAULT_OUT, help="markdown table (default benchmarks/results/gpu.md)"
    )
    parser.add_argument(
        "--jsonl", default=None, help="jsonl of the lines (default: --out with .jsonl)"
    )
    parser.add_argument(
        "--resume", action="store_true", help="keep the jsonl and skip the lines already there"
    )
    parser.add_argument(
        "--report-only", action="store_true", help="only rewrite --out from the lines in --jsonl"
    )
    args = parser.parse_args(argv)
    grid = (
        QUICK
        if args.quick
        else dict(batches=BATCHES, Ms=MS, depths=DEPTHS, rounds=7, steps_per_round=10)
    )
    for key in ("batches", "Ms", "depths", "rounds", "steps_per_round"):
        if getattr(args, key) is None:
            setattr(args, key, grid[key])
    if args.jsonl is None:
        args.jsonl = os.path.splitext(args.out)[0] + ".jsonl"
    return args


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.report_only:
        write_markdown(read_lines(args.jsonl), args.out)
        print(f"wrote {args.out}")
        return 0
    if not args.no_gpflux and importlib.util.find_spec("gpflux") is None:
        raise SystemExit(
            'benchmarks/gpu.py: gpflux is not installed (pip install -e ".[bench]"); '
            "pass --no-gpflux to time deepgp_gi alone"
        )
    with dg.linalg.accelerator_branch() if args.accelerator_branch else contextlib.nullcontext():
        return _run(args, argv)


def _run(args, argv) -> int:
    if args.tf32 is not None:
        tf.config.experimental.enable_tensor_float_32_execution(args.tf32 == "on")
    header = dict(
        device=device_name(),
        tensorflow=tf.__version__,
        commit=code_commit(),
        tf32=bool(tf.config.experimental.tensor_float_32_execution_enabled()),
        cholesky_branch="accelerator"
        if args.accelerator_branch or tf.config.list_logical_devices("GPU")
        else "host",
        command="python benchmarks/gpu.py " + " ".join(shlex.quote(a) for a in argv),
        rounds=args.rounds,
        steps_per_round=args.steps_per_round,
    )
    for path in (args.jsonl, args.out):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if not args.resume and os.path.exists(args.jsonl):
        os.remove(args.jsonl)
    done = {_line_key(l["config"], l["model"]) for l in read_lines(args.jsonl)}
    dtype = "float32" if args.float32 else "float64"
    names = model_names(args.families, args.modes, gpflux=not args.no_gpflux)
    print(f"Device: {header['device']}; TensorFlow {tf.__version__}", flush=True)
    for batch in args.batches:
        for M in args.Ms:
            for depth in args.depths:
                config = dict(batch=batch, M=M, depth=depth, dtype=dtype)
                todo = [n for n in names if _line_key(config, n) not in done]
                if not todo:
                    continue
                for line in run_config(config, todo, args, header):
                    print(summary_row(line), flush=True)
                    append_line(args.jsonl, line)
    write_markdown(read_lines(args.jsonl), args.out)
    print(f"wrote {args.out} and {args.jsonl}")
    return 0


# --------------------------------------------------------------------------- report
def _fmt(value, spec: str) -> str:
    return (
        "–"
        if value is None or (isinstance(value, float) and not math.isfinite(value))
        else format(value, spec)
    )


def summary_row(line: dict) -> str:
    """One line of console output for a jsonl line."""
    c = line["config"]
    text = f"batch {c['batch']} M {c['M']} depth {c['depth']} {c['dtype']} | {line['model']}: "
    if line.get("error"):
        return text + f"failed: {line['error']}"
    text += (
        f"{line['ms_per_step']:.2f} ms, {line['flops'] / 1e9:.4g} GFLOP, "
        f"{line['bytes'] / 1e6:.4g} MB"
    )
    if "executed_ops" in line and line["mode"] == "plain":
        heavy = ", ".join(f"{k} {v:g}" for k, v in line["heavy_ops"].items())
        text += f", {line['executed_ops']:g} ops ({heavy})"
        if line.get("gpu_kernels") is not None:
            text += f", {line['gpu_kernels']:g} GPU kernels"
        if line.get("xla_cpu_thunks") is not None:
            text += f", {line['xla_cpu_thunks']:g} XLA CPU thunks"
    if line.get("unknown_shape_ops"):
        text += f", unknown-shape ops {line['unknown_shape_ops']}"
    if "elbo_rel_diff" in line:
        text += f", ELBO float32 vs float64 {line['elbo_rel_diff']:.2e} (relative)"
    return text


def _row(l: dict, reference: Optional[float], float32: bool) -> List[str]:
    c = l["config"]
    cells = [c["batch"], c["M"], c["depth"], l["model"]]
    width = 13
    if l.get("error"):
        cells += [f"failed ({l['error'].split(':')[0]})"] + ["–"] * (width - 1)
    else:
        ms, heavy, launches = l["ms_per_step"], l.get("heavy_ops") or {}, l.get("launches")
        # an XLA step runs as one function op; on a GPU the trace's host plane holds only the
        # function call and its launch, not the ops behind the kernels (kernels/step counts those)
        executed = (
            l.get("executed_ops") if l["mode"] == "plain" and l.get("gpu_kernels") is None else None
        )
        cells += [
            _fmt(ms, ".2f"),
            _fmt(ms / reference if reference else None, ".2f"),
            _fmt(l["flops"] / 1e9, ".4g"),
            _fmt(l["bytes"] / 1e6, ".4g"),
            _fmt(l["flops"] / ms / 1e6, ".3g"),
            _fmt(executed, "g"),
            *[_fmt(heavy.get(label) if executed is not None else None, "g") for label, _ in HEAVY],
            _fmt(launches, "g"),
            _fmt(l["flops"] / launches / 1e6 if launches else None, ".3g"),
            sum(l["unknown_shape_ops"].values()),
        ]
    if float32:
        cells.append(_fmt(l.get("elbo_rel_diff"), ".2e") if "elbo_error" not in l else "failed")
    return [str(x) for x in cells]


def _table(lines: List[dict], float32: bool) -> List[str]:
    head = [
        "batch",
        "M",
        "depth",
        "model",
        "ms/step",
        "/ GPflux",
        "GFLOP/step",
        "traffic MB/step",
        "GFLOP/s",
        "ops/step",
        *[label for label, _ in HEAVY],
        "kernels/step",
        "MFLOP/kernel",
        "unknown-shape ops",
    ]
    if float32:
        head.append("ELBO f32 vs f64 (rel.)")
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    reference = {
        (json.dumps(l["config"], sort_keys=True), l["mode"]): l["ms_per_step"]
        for l in lines
        if l["family"] == GPFLUX
    }
    for l in lines:
        ref = reference.get((json.dumps(l["config"], sort_keys=True), l["mode"]))
        rows.append("| " + " | ".join(_row(l, ref, float32)) + " |")
    return rows


LEGEND = (
    "Median ms per compiled Adam step (ELBO + gradient + update, 1 Monte Carlo sample; kin8nm "
    "inputs tiled to the batch size, inner width 8), models alternated round by round in one "
    "process. `/ GPflux`: the time over GPflux DSVI's in the same mode (plain or XLA). GFLOP and "
    "traffic: one step's floating-point operations and the bytes read plus written by every op, "
    "from the traced graph's static shapes before fusion (`step_cost`; the jitter retries behind "
    "a `tf.cond` are not counted, the branch-free ones of a GPU step are). ops/step and the op "
    "columns: TensorFlow kernels executed per step, from a profiler trace (`--profile`; `_Mkl` "
    "variants included; an XLA step runs as one function op, and on a GPU the host's trace holds "
    "the function call, not the ops behind its kernels: –). kernels/step: kernel launches on the "
    "GPU when one ran the step, XLA's executed thunks for an XLA step on a CPU, else the executed "
    "ops; MFLOP/kernel: the step's flops over them (work per launch)."
)


#: Op types listed per row in "GPU kernels by the op that launched them".
TOP_GPU_OPS = 6


def _gpu_kernel_sources(lines: List[dict]) -> List[str]:
    """For every row measured on a GPU with ``gpu_by_type``: its kernels per step and the op
    types that launched the most of them (what to batch or fuse next)."""
    rows = [l for l in lines if l.get("gpu_by_type")]
    if not rows:
        return []
    out = [
        "## GPU kernels by the op that launched them",
        "",
        f"Per step, the {TOP_GPU_OPS} TensorFlow op types whose kernels were launched most (the "
        "`tf_op` of each kernel in the trace; `(no op)`: a kernel tied to none).",
        "",
        "| batch | dtype | model | kernels/step | most launched by |",
        "|---|---|---|---|---|",
    ]
    for l in rows:
        c, top = l["config"], list(l["gpu_by_type"].items())[:TOP_GPU_OPS]
        out.append(
            f"| {c['batch']} | {c['dtype']} | {l['model']} | {_fmt(l.get('gpu_kernels'), 'g')} | "
            + ", ".join(f"{op} {n:g}" for op, n in top)
            + " |"
        )
    return out + [""]


def write_markdown(lines: List[dict], path: str) -> None:
    """The report of ``lines`` (one table per dtype, rows in run order) written to ``path``."""
    devices = "; ".join(sorted({l["device"] for l in lines})) or device_name()
    versions = ", ".join(sorted({l["tensorflow"] for l in lines})) or tf.__version__
    commands = list(
        dict.fromkeys(
            f"`{l['command']}` (commit {l['commit']}, {l['rounds']} rounds x "
            f"{l['steps_per_round']} steps)"
            for l in lines
        )
    )
    md = [
        "# Training-step cost on the accelerator: every deep-GP family against GPflux",
        "",
        f"Device: {devices}. TensorFlow {versions}.",
        "",
        "Commands:",
        *[f"- {c}" for c in commands],
        "",
        LEGEND,
        "",
        'What these numbers mean, and what is still to measure: docs/performance.md, "On a GPU".',
        "",
    ]
    for dtype in ("float64", "float32"):
        chosen = [l for l in lines if l["config"]["dtype"] == dtype]
        if chosen:
            md += [f"## {dtype}", ""]
            if dtype == "float32":
                tf32 = sorted(
                    {{True: "on", False: "off"}.get(l.get("tf32"), "not recorded") for l in chosen}
                )
                md += [
                    "TensorFloat-32 matmuls (float32 on Ampere and newer GPUs; `--tf32`): "
                    f"{', '.join(tf32)}.",
                    "",
                ]
            md += _table(chosen, dtype == "float32") + [""]
    md += _gpu_kernel_sources(lines)
    failures = [l for l in lines if l.get("error") or l.get("elbo_error")]
    if failures:
        md += (
            ["## Failures", ""]
            + [
                f"- batch {l['config']['batch']}, M {l['config']['M']}, depth "
                f"{l['config']['depth']}, {l['config']['dtype']}, {l['model']}: "
                f"{l.get('error') or l.get('elbo_error')}"
                for l in failures
            ]
            + [""]
        )
    with open(path, "w") as fh:
        fh.write("\n".join(md) + "\n")


if __name__ == "__main__":
    sys.exit(main())
