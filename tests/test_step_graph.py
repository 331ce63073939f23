"""The compiled training step holds no op that makes an accelerator wait for the host.

On a GPU, a training step is launch-bound: the host runs ahead of the device as long as nothing in
the step needs a device value on the host. These ops do: ``Assert``/``PrintV2`` (host kernels
reading a device predicate), functional ``If``/``While`` (the predicate is read on the host, and
each branch is a function call), Python callbacks, ``CheckNumerics`` and the data-dependent
shapes of ``Where``/``Unique``/``DynamicPartition``. :class:`~deepgp_gi.training.step.TrainStep`
(what ``fit`` runs) is traced here for every family, plain and XLA, with
:func:`deepgp_gi.linalg.safe_cholesky` taking its accelerator branch (the one it takes when a GPU
is visible), and its graph, nested functions and gradients included, must hold none of them.

A ``tf.debugging.Assert`` left in the step, or a ``tf.linalg.set_diag`` on a run-time batch shape
(its gradient runs three ``tf.cond``s), makes this fail.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf

import deepgp_gi as dg
from deepgp_gi import linalg
from deepgp_gi.families import DEEP_GP_FAMILIES
from deepgp_gi.training.step import TrainStep

HOST_SYNC_OPS = frozenset(
    {
        "Assert",
        "Print",
        "PrintV2",
        "If",
        "StatelessIf",
        "While",
        "StatelessWhile",
        "PyFunc",
        "PyFuncStateless",
        "EagerPyFunc",
        "CheckNumerics",
        "CheckNumericsV2",
        "Where",
        "Unique",
        "UniqueV2",
        "DynamicPartition",
    }
)
BNN_POSTERIORS = ("factorised", "local", "global", "factorised_global")


def op_types(concrete_function) -> collections.Counter:
    """Op types of a traced function: its graph and every function in its library."""
    graph_def = concrete_function.graph.as_graph_def()
    counts = collections.Counter(node.op for node in graph_def.node)
    for function in graph_def.library.function:
        counts.update(node.op for node in function.node_def)
    return counts


def _data(n: int = 24):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 3))
    return X, np.sin(X[:, :1]) + 0.1 * rng.normal(size=(n, 1))


def _traced_step(model, X, Y, jit_compile: bool):
    variables = list(model.trainable_variables)
    optimizer = dg.training.adam(0.01, variables)
    step = TrainStep(
        model,
        optimizer,
        variables,
        tf.Variable(0, dtype=tf.int64),
        num_samples=2,
        seed=0,
        jit_compile=jit_compile,
    )
    args = (tf.constant(0, tf.int64), tf.constant(X), tf.constant(Y), step.kl_weight_tensor(1.0))
    return step._compiled.get_concrete_function(*args)


@pytest.fixture
def accelerator_branch():
    """``safe_cholesky`` traced as on a machine with a GPU (its branch-free escalation)."""
    with linalg.accelerator_branch():
        yield


MODELS = [("deep GP", name) for name in DEEP_GP_FAMILIES] + [
    ("BNN", name) for name in BNN_POSTERIORS
]


# the plain step of every model in the default suite; the XLA step (the same graph, compiled) in the
# slow suite
@pytest.mark.parametrize(
    "jit_compile", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["plain", "xla"]
)
@pytest.mark.parametrize("kind, posterior", MODELS)
def test_training_step_has_no_host_synchronising_op(
    accelerator_branch, kind, posterior, jit_compile
):
    X, Y = _data()
    if kind == "deep GP":
        model = dg.build_deep_gp(X, Y, depth=2, posterior=posterior, num_inducing=5, seed=0)
    else:
        model = dg.build_bnn(X, Y, hidden=(6, 6), posterior=posterior, num_inducing=5, seed=0)
    counts = op_types(_traced_step(model, X, Y, jit_compile))
    assert (
        counts["Cholesky"] >= 1 or posterior == "factorised"
    )  # the step was traced with its factorisations
    found = {op: n for op, n in counts.items() if op in HOST_SYNC_OPS}
    assert found == {}, f"{kind} {posterior}: host-synchronising ops in the training step: {found}"


@pytest.mark.parametrize("jit_compile", [False, True], ids=["plain", "xla"])
def test_the_update_is_one_fused_kernel_per_variable(jit_compile):
    """``fit``'s Adam applies each variable's update with one ``ResourceApplyAdam`` kernel, not
    about 25 elementwise ops (tf_keras's current Adam has no fused update)."""
    X, Y = _data()
    model = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=5, seed=0)
    counts = op_types(_traced_step(model, X, Y, jit_compile))
    assert counts["ResourceApplyAdam"] == len(model.trainable_variables)
    assert (
        counts["AssignSubVariableOp"] == 0 and counts["AssignAddVariableOp"] <= 1
    )  # at most the iteration count


def test_the_audit_sees_an_assert_and_a_set_diag_gradient(accelerator_branch):
    """The oracle's other side: the two constructs this file guards against are found."""
    x = tf.Variable(tf.eye(3, batch_shape=[2], dtype=tf.float64))

    @tf.function(input_signature=[tf.TensorSpec([None, 3, 3], tf.float64)])
    def step(A):
        with tf.GradientTape() as tape:
            B = tf.linalg.set_diag(A * x, tf.linalg.diag_part(A) + 1.0)
            loss = tf.reduce_sum(B)
        check = tf.debugging.Assert(loss > 0, [loss])
        with tf.control_dependencies([check]):
            return tape.gradient(loss, x)

    counts = op_types(step.get_concrete_function())
    assert counts["Assert"] == 1 and counts["StatelessIf"] >= 1


def test_natural_gradient_step_syncs_only_in_gpflows_assign(accelerator_branch):
    """The natural-gradient step's only host-synchronising ops are the ``CheckNumerics`` that
    GPflow's ``Parameter.assign`` runs on each updated block (``q_mu`` and ``q_sqrt`` per layer)."""
    from deepgp_gi.training.step import NaturalGradientStep

    X, Y = _data()
    model = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=5, seed=0)
    blocks = model.posterior.natural_gradient_blocks()
    taken = {
        id(v)
        for q_mu, q_sqrt in blocks
        for v in (q_mu.unconstrained_variable, q_sqrt.unconstrained_variable)
    }
    variables = [v for v in model.trainable_variables if id(v) not in taken]
    optimizer = dg.training.adam(0.01, variables)
    step = NaturalGradientStep(
        model,
        optimizer,
        variables,
        tf.Variable(0, dtype=tf.int64),
        natgrad_blocks=blocks,
        gamma=0.1,
        num_samples=2,
        seed=0,
    )
    args = (tf.constant(0, tf.int64), tf.constant(X), tf.constant(Y), step.kl_weight_tensor(1.0))
    counts = op_types(step._compiled.get_concrete_function(*args))
    found = {op: n for op, n in counts.items() if op in HOST_SYNC_OPS}
    assert found == {"CheckNumerics": 2 * len(blocks)}
