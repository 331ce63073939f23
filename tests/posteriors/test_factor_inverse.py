"""Factor-and-inverse helpers (deepgp_gi.linalg.cholesky_with_inverse, cholesky_and_solve,
triangular_solve_with_inverse) and the structured families' per-point algebra built on them:
values and gradients against TensorFlow's Cholesky and triangular solve, the jitter ladder and
failure report on every branch, and a step whose operations do not depend on the batch size."""

import collections
import contextlib

import numpy as np
import pytest
import tensorflow as tf

import deepgp_gi as dg
from deepgp_gi import linalg
from deepgp_gi.linalg import (
    CholeskyError,
    cholesky_and_solve,
    cholesky_with_inverse,
    triangular_solve_with_inverse,
)
from deepgp_gi.posteriors.structured_linalg import (
    append_to_cholesky,
    append_to_inverse,
    whiten_by_inverse,
    whiten_transposed_cross,
)

BRANCHES = ["host", "accelerator"]


def _branch(name):
    return linalg.accelerator_branch() if name == "accelerator" else contextlib.nullcontext()


def _spd(rng, shape, n, shift=0.1):
    X = rng.normal(size=tuple(shape) + (n, n))
    return X @ np.swapaxes(X, -1, -2) + shift * np.eye(n)


def _reference_factor_and_inverse(A):
    L = tf.linalg.cholesky(A)
    return L, tf.linalg.triangular_solve(
        L, tf.broadcast_to(tf.eye(A.shape[-1], dtype=A.dtype), tf.shape(A))
    )


@pytest.mark.parametrize("branch", BRANCHES)
@pytest.mark.parametrize("unrolled", [False, True], ids=["lapack", "unrolled"])
@pytest.mark.parametrize("n", [1, 3, 8])
def test_factor_and_inverse_and_their_gradients_equal_tensorflows(rng, branch, unrolled, n):
    """``(L, L^{-1})`` and the gradient of any function of both (a full, not triangular, upstream
    on each) against ``tf.linalg.cholesky`` followed by a triangular solve against ``I``."""
    A = tf.constant(_spd(rng, [2, 3], n))
    W_L, W_T = (tf.constant(rng.normal(size=A.shape)) for _ in range(2))

    @tf.function
    def both(A):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(A)
            L, T = cholesky_with_inverse(A, unrolled=unrolled)
            mine = tf.reduce_sum(L * W_L) + tf.reduce_sum(tf.sin(T) * W_T)
            L_ref, T_ref = _reference_factor_and_inverse(A)
            ref = tf.reduce_sum(L_ref * W_L) + tf.reduce_sum(tf.sin(T_ref) * W_T)
        return L, T, L_ref, T_ref, tape.gradient(mine, A), tape.gradient(ref, A)

    with _branch(branch):
        L, T, L_ref, T_ref, grad, grad_ref = both(A)
    np.testing.assert_allclose(L, L_ref, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(T, T_ref, rtol=1e-11, atol=1e-12)
    assert np.all(np.triu(np.asarray(L), 1) == 0) and np.all(np.triu(np.asarray(T), 1) == 0)
    np.testing.assert_allclose(
        grad, grad_ref, rtol=1e-9, atol=1e-10 * np.abs(grad_ref.numpy()).max()
    )


def test_factor_and_solve_and_its_gradient_equal_tensorflows(rng):
    """``cholesky_and_solve``'s ``(L, L^{-1} rhs)``: the solve's values, and the gradient in the
    matrix and the right-hand side of TensorFlow's factorisation and solve."""
    A, rhs = tf.constant(_spd(rng, [2], 5)), tf.constant(rng.normal(size=(2, 5, 7)))
    W_L, W_X = tf.constant(rng.normal(size=(2, 5, 5))), tf.constant(rng.normal(size=(2, 5, 7)))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([A, rhs])
        L, X = cholesky_and_solve(A, rhs)
        mine = tf.reduce_sum(L * W_L) + tf.reduce_sum(tf.sin(X) * W_X)
        L_ref = tf.linalg.cholesky(A)
        X_ref = tf.linalg.triangular_solve(L_ref, rhs)
        ref = tf.reduce_sum(L_ref * W_L) + tf.reduce_sum(tf.sin(X_ref) * W_X)
    np.testing.assert_allclose(L, L_ref, rtol=1e-12)
    np.testing.assert_allclose(X, X_ref, rtol=1e-12, atol=1e-13)
    for a, b in zip(tape.gradient(mine, [A, rhs]), tape.gradient(ref, [A, rhs])):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "batched"])
def test_solve_with_inverse_has_the_solves_values_and_gradient(rng, shared):
    L = tf.linalg.cholesky(tf.constant(_spd(rng, [] if shared else [3], 4)))
    T = tf.linalg.triangular_solve(L, tf.broadcast_to(tf.eye(4, dtype=L.dtype), tf.shape(L)))
    rhs = tf.constant(rng.normal(size=(4, 6) if shared else (3, 4, 6)))
    W = tf.constant(rng.normal(size=rhs.shape))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([L, rhs])
        X = triangular_solve_with_inverse(L, T, rhs)
        X_ref = tf.linalg.triangular_solve(L, rhs)
        mine, ref = tf.reduce_sum(tf.sin(X) * W), tf.reduce_sum(tf.sin(X_ref) * W)
    np.testing.assert_array_equal(X, X_ref)
    for a, b in zip(tape.gradient(mine, [L, rhs]), tape.gradient(ref, [L, rhs])):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def _with_min_eigenvalue(rng, n, lowest):
    Q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    return (Q * np.r_[lowest, np.ones(n - 1)]) @ Q.T


@pytest.mark.parametrize("branch", BRANCHES)
@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_unrolled_factor_keeps_the_ladder_and_reports_failures(rng, branch, jit_compile):
    """The elementwise factorisation has safe_cholesky's ladder: a member that needs no jitter
    gets none, the others the smallest rung that works (host: every rung in turn; accelerator:
    the branch-free rungs ``[0, 3, 5]``, here in one pass with the plain factorisation), and a
    member no rung repairs is a CholeskyError, compiled and eagerly."""
    n = 5
    members = [
        _with_min_eigenvalue(rng, n, 0.5),
        _with_min_eigenvalue(rng, n, -5e-6),
        _with_min_eigenvalue(rng, n, -3e-9),
    ]

    @linalg.checked_function(jit_compile=jit_compile)
    def factor(A):
        return cholesky_with_inverse(A, unrolled=True)

    with _branch(branch):
        L, T = factor(tf.constant(np.stack(members)))
    L, T = L.numpy(), T.numpy()
    A = np.stack(members)
    scale = np.mean(np.abs(np.diagonal(A, axis1=-2, axis2=-1)), axis=-1)
    added = (
        np.mean(np.diagonal(L @ np.swapaxes(L, -1, -2) - A, axis1=-2, axis2=-1), axis=-1) / scale
    )
    np.testing.assert_allclose(added, [0.0, 1e-5, 1e-8], rtol=1e-4, atol=1e-12)
    np.testing.assert_allclose(L[0], np.linalg.cholesky(members[0]), rtol=1e-12)
    np.testing.assert_allclose(T @ L, np.broadcast_to(np.eye(n), L.shape), atol=1e-9)
    bad = np.stack(members[:2] + [_with_min_eigenvalue(rng, n, -0.5)])
    checked = linalg.checked_function(
        lambda A: cholesky_with_inverse(A, unrolled=True, name="my covariance"),
        jit_compile=jit_compile,
    )
    with (
        pytest.raises(CholeskyError, match="my covariance is not positive definite"),
        _branch(branch),
    ):
        checked(tf.constant(bad))
    with pytest.raises(CholeskyError, match="my covariance"):
        cholesky_with_inverse(bad, unrolled=True, name="my covariance")


@pytest.mark.parametrize("branch", BRANCHES)
def test_no_ladder_for_a_matrix_positive_definite_by_construction(rng, branch):
    """``max_tries=0`` factorises once (one Cholesky, no ``tf.cond``) and still reports
    a failure."""
    A = tf.constant(_spd(rng, [2], 4))

    def run(A):
        with linalg.cholesky_checks() as checks:
            L, T = cholesky_with_inverse(A, max_tries=0, name="I + G")
        return L, T, checks.status()

    with _branch(branch):
        graph = tf.function(run).get_concrete_function(tf.TensorSpec(A.shape, tf.float64)).graph
        L, T, status = tf.function(run)(A)
    types = collections.Counter(op.type for op in graph.get_operations())
    assert types["Cholesky"] == 1 and types["StatelessIf"] == types["If"] == 0
    assert int(status) == 0
    np.testing.assert_allclose(L, np.linalg.cholesky(A.numpy()), rtol=1e-12)
    with pytest.raises(CholeskyError, match="I \\+ G is not positive definite"):
        linalg.checked_function(lambda A: cholesky_with_inverse(A, max_tries=0, name="I + G"))(
            tf.constant(-np.eye(3))
        )


@pytest.mark.parametrize("branch", BRANCHES)
def test_accelerator_factorisation_and_ladder_are_one_batched_cholesky(rng, branch):
    """With a GPU visible (or ``accelerator_branch``) the plain factorisation is the ladder's first
    rung: one Cholesky op in the graph (safe_cholesky has two there), and the factor of a matrix
    that needs no jitter is its plain factor."""
    A = tf.constant(_spd(rng, [3], 6, shift=1.0))
    with _branch(branch):
        fn = tf.function(lambda A: cholesky_with_inverse(A).factor)
        graph = fn.get_concrete_function(tf.TensorSpec(A.shape, tf.float64)).graph
        L = fn(A)
    types = collections.Counter(op.type for op in graph.get_operations())
    assert types["Cholesky"] == 1
    np.testing.assert_allclose(L, np.linalg.cholesky(A.numpy()), rtol=1e-12)


def _executed_graph_types(fn, *specs):
    """Op types of a traced function, the functions it calls (gradients, conds) included."""
    graph = fn.get_concrete_function(*specs).graph
    counts = collections.Counter()

    def walk(g, seen):
        for op in g.get_operations():
            counts[op.type] += 1
            for attr in ("f", "then_branch", "else_branch"):
                try:
                    name = op.get_attr(attr).name
                except (ValueError, TypeError, AttributeError):
                    continue
                inner = g._get_function(name)
                if inner is not None and name not in seen:
                    seen.add(name)
                    walk(inner.graph, seen)

    walk(graph, set())
    return counts


# every case in the slow suite (stripes-and-arrow on the host branch alone takes about 12 s); the
# default suite checks the factor's values and gradients above
@pytest.mark.slow
@pytest.mark.parametrize("family", ["fully_coupled", "stripes_arrow"])
@pytest.mark.parametrize("branch", ["host", "accelerator"])
def test_structured_step_has_no_per_point_factorisation_and_its_ops_do_not_grow_with_the_batch(
    rng, family, branch
):
    """The ELBO and its gradient of a depth-3 fully-coupled / STAR model: no Cholesky or
    triangular solve takes a per-point batch (the per-point factors are elementwise and carried as
    inverses), and the traced graph has the same ops for a batch of 13 and of 41 (constants
    aside)."""
    X = rng.normal(size=(41, 3))
    Y = np.sin(X[:, :1])
    model = dg.build_deep_gp(X, Y, depth=3, posterior=family, num_inducing=5, seed=0)
    variables = model.trainable_variables

    def loss_and_grad(Xb, Yb):
        with tf.GradientTape() as tape:
            loss = -model.elbo((Xb, Yb), 1, seed=dg.noise.SeededNoise([1, 2]))
        return loss, tape.gradient(loss, variables)

    counts = []
    with _branch(branch):
        for N in (13, 41):
            fn = tf.function(loss_and_grad)
            specs = (tf.TensorSpec([N, 3], tf.float64), tf.TensorSpec([N, 1], tf.float64))
            graph = fn.get_concrete_function(*specs).graph
            per_point = [
                op
                for op in graph.get_operations()
                if op.type in ("Cholesky", "MatrixTriangularSolve")
                and op.inputs[0].shape.rank is not None
                and N in op.inputs[0].shape.as_list()[:-2]
            ]
            assert per_point == []
            counts.append(_executed_graph_types(fn, *specs))
            loss, _ = fn(tf.constant(X[:N]), tf.constant(Y[:N]))
            assert np.isfinite(loss.numpy())
    # constants aside: a zeros tensor is traced as a Const below 1,000 elements, as a Fill above
    for c in counts:
        c.pop("Const", None), c.pop("Fill", None)
    assert counts[0] == counts[1]


def test_inverse_recursion_matches_the_factor_recursion(rng):
    """``whiten_by_inverse`` and ``append_to_inverse`` against ``whiten_transposed_cross`` and
    ``append_to_cholesky``: the same ``G^T`` and shift, and the inverse of the grown factor."""
    Sigma = _spd(rng, [4], 5, shift=1.0)
    L1 = np.linalg.cholesky(Sigma[:, :3, :3])
    T1 = np.linalg.inv(L1)
    cross_t = Sigma[:, :3, 3:]
    eps = rng.normal(size=(4, 3))
    Gt, shift = whiten_by_inverse(tf.constant(T1), tf.constant(cross_t), tf.constant(eps))
    Gt_ref, shift_ref = whiten_transposed_cross(
        tf.constant(L1), tf.constant(cross_t), tf.constant(eps)
    )
    np.testing.assert_allclose(Gt, Gt_ref, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(shift, shift_ref, rtol=1e-12, atol=1e-13)
    schur = Sigma[:, 3:, 3:] - np.swapaxes(Gt_ref.numpy(), -1, -2) @ Gt_ref.numpy()
    L2 = np.linalg.cholesky(schur)
    grown = append_to_cholesky(
        tf.constant(L1), tf.linalg.matrix_transpose(Gt_ref), tf.constant(L2)
    ).numpy()
    inverse = append_to_inverse(tf.constant(T1), Gt, tf.constant(np.linalg.inv(L2))).numpy()
    np.testing.assert_allclose(grown, np.linalg.cholesky(Sigma), atol=1e-12)
    np.testing.assert_allclose(inverse, np.linalg.inv(grown), rtol=1e-10, atol=1e-12)
    independent = append_to_inverse(tf.constant(T1), None, tf.constant(np.linalg.inv(L2))).numpy()
    np.testing.assert_allclose(independent[:, 3:, :3], 0.0)
