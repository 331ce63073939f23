"""safe_cholesky: escalating jitter, gradients, and CholeskyError eagerly and compiled."""

import pickle

import numpy as np
import pytest
import tensorflow as tf

from deepgp_gi import linalg
from deepgp_gi.linalg import CholeskyError, safe_cholesky

INDEFINITE = np.array([[1.0, 2.0], [2.0, 1.0]])  # eigenvalues 3 and -1: no jitter ladder fixes it


def test_safe_cholesky_equals_plain_cholesky_on_pd(rng):
    A = rng.normal(size=(3, 5, 5))
    A = A @ np.transpose(A, (0, 2, 1)) + 5 * np.eye(5)
    np.testing.assert_allclose(safe_cholesky(A), np.linalg.cholesky(A), rtol=1e-12)


def test_safe_cholesky_escalates_only_failing_members(rng):
    x = rng.normal(size=(4, 1))
    singular = x @ x.T  # rank one: plain Cholesky fails
    good = singular + np.eye(4)
    L = safe_cholesky(np.stack([good, singular])).numpy()
    np.testing.assert_allclose(L[0], np.linalg.cholesky(good), rtol=1e-12)
    assert np.all(np.isfinite(L[1]))
    jittered = L[1] @ L[1].T
    # the repaired factor reproduces the matrix up to a small relative jitter
    assert np.max(np.abs(jittered - singular)) < 1e-3 * np.mean(np.diag(singular))


def test_safe_cholesky_compiled_with_gradient(rng):
    A = tf.Variable(np.eye(3) * 2.0)

    @tf.function
    def f():
        with tf.GradientTape() as tape:
            out = tf.reduce_sum(safe_cholesky(A))
        return out, tape.gradient(out, A)

    value, grad = f()
    assert np.isfinite(value.numpy()) and np.all(np.isfinite(grad.numpy()))


def test_safe_cholesky_clear_error_on_indefinite():
    A = np.array([[1.0, 0.0], [0.0, -5.0]])
    with pytest.raises(tf.errors.InvalidArgumentError, match="my_matrix is not positive definite"):
        safe_cholesky(A, name="my_matrix")


def test_cholesky_error_is_an_invalid_argument_error():
    assert issubclass(CholeskyError, tf.errors.InvalidArgumentError)
    err = pickle.loads(pickle.dumps(CholeskyError("boom")))
    assert isinstance(err, CholeskyError) and err.message == "boom"


def test_eager_indefinite_raises_cholesky_error_with_details():
    with pytest.raises(CholeskyError) as info:
        safe_cholesky(INDEFINITE, name="K_uu of layer 0")
    message = str(info.value)
    assert "K_uu of layer 0 is not positive definite" in message
    assert "[2, 2]" in message and "float64" in message
    # the last absolute jitter: 1e-8 * 10**5 * mean|diag| = 1e-3
    assert "last jitter tried: 1.000e-03" in message


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_compiled_indefinite_raises_cholesky_error(jit_compile):
    @linalg.checked_function(jit_compile=jit_compile)
    def factor(A):
        return safe_cholesky(A, name="bad matrix")

    np.testing.assert_allclose(factor(tf.constant(np.eye(2) * 4.0)), np.eye(2) * 2.0)
    with pytest.raises(CholeskyError, match="bad matrix is not positive definite"):
        factor(tf.constant(INDEFINITE))


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_status_flags_the_first_failing_factorisation(jit_compile):
    @tf.function(jit_compile=jit_compile)
    def two(A, B):
        with linalg.cholesky_checks() as checks:
            safe_cholesky(A, name="first")
            safe_cholesky(B, name="second")
        assert checks.num_checks == 2
        return checks.status()

    good, bad = tf.constant(np.eye(2)), tf.constant(INDEFINITE)
    assert int(two(good, good)) == 0
    linalg.raise_if_failed(two(good, good))
    assert "second is not" in linalg.failure_message(two(good, bad))
    assert "first is not" in linalg.failure_message(two(bad, bad))
    with pytest.raises(CholeskyError, match="first is not positive definite.*step 7"):
        linalg.raise_if_failed(two(bad, good), context="step 7")


def test_plain_tf_function_without_collector_still_asserts():
    f = tf.function(lambda A: safe_cholesky(A, name="unchecked"))
    with pytest.raises(tf.errors.InvalidArgumentError, match="unchecked is not positive definite"):
        f(tf.constant(INDEFINITE))


def test_xla_without_collector_warns_at_trace_time():
    f = tf.function(lambda A: safe_cholesky(A, name="unchecked"), jit_compile=True)
    with pytest.warns(RuntimeWarning, match="without deepgp_gi.linalg.cholesky_checks"):
        f(tf.constant(np.eye(2)))


@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
def test_escalation_repairs_singular_psd_with_finite_gradient(rng, mode):
    x = rng.normal(size=(5, 2))
    singular = x @ x.T  # rank two: the plain factorisation fails
    assert not np.all(np.isfinite(tf.linalg.cholesky(singular).numpy()))
    good = singular + np.eye(5)
    A = tf.Variable(np.stack([good, singular]))

    def value_and_grad():
        with tf.GradientTape() as tape:
            L = safe_cholesky(A)
            loss = tf.reduce_sum(tf.linalg.diag_part(L))
        return L, tape.gradient(loss, A)

    if mode != "eager":
        value_and_grad = linalg.checked_function(value_and_grad, jit_compile=mode == "xla")
    L, grad = value_and_grad()
    L, grad = L.numpy(), grad.numpy()
    np.testing.assert_allclose(L[0], np.linalg.cholesky(good), rtol=1e-10)
    assert np.all(np.isfinite(L[1])) and np.all(np.isfinite(grad))
    scale = np.mean(np.diag(singular))
    rebuilt = L[1] @ L[1].T
    jitter = np.mean(np.diag(rebuilt - singular)) / scale
    # repaired with a jitter on the ladder 1e-8 * 10**k (relative to the mean diagonal)
    k = np.log10(jitter / 1e-8)
    assert np.isclose(k, round(k), atol=1e-3) and 0 <= round(k) <= 5
    np.testing.assert_allclose(rebuilt - singular, jitter * scale * np.eye(5), atol=1e-9 * scale)
    # the good member's gradient is exactly d sum(diag chol(A)) / dA of the plain factorisation
    with tf.GradientTape() as tape:
        G = tf.constant(good)
        tape.watch(G)
        ref = tf.reduce_sum(tf.linalg.diag_part(tf.linalg.cholesky(G)))
    np.testing.assert_allclose(grad[0], tape.gradient(ref, G).numpy(), rtol=1e-10, atol=1e-12)


def test_gradient_matches_finite_differences_after_escalation(rng):
    x = rng.normal(size=(4, 1))
    singular = x @ x.T
    L_rep = safe_cholesky(singular).numpy()
    jitter = np.mean(np.diag(L_rep @ L_rep.T - singular))
    direction = rng.normal(size=(4, 4))
    direction = direction + direction.T
    A = tf.constant(singular)
    with tf.GradientTape() as tape:
        tape.watch(A)
        loss = tf.reduce_sum(tf.math.log(tf.linalg.diag_part(safe_cholesky(A))))
    analytic = np.sum(tape.gradient(loss, A).numpy() * direction)
    # the function differentiated is log det(A + jitter I) / 2 with the jitter held fixed
    h = 1e-3 * jitter  # small against the jitter, large against the rounding of A's entries

    def f(B):
        return 0.5 * np.linalg.slogdet(B + jitter * np.eye(4))[1]

    numeric = (f(singular + h * direction) - f(singular - h * direction)) / (2 * h)
    np.testing.assert_allclose(analytic, numeric, rtol=1e-4)


@pytest.mark.parametrize("static", [True, False], ids=["static", "dynamic"])
def test_cholesky_gradient_equals_tensorflows_for_any_upstream(rng, static):
    """``_cholesky_backward`` (the mask form with a static size, ``set_diag`` otherwise) against
    TensorFlow's own Cholesky gradient, for a full (not lower-triangular) upstream gradient."""
    X = rng.normal(size=(3, 6, 6))
    A = X @ np.transpose(X, (0, 2, 1)) + 6 * np.eye(6)
    upstream = rng.normal(size=(3, 6, 6))
    spec = tf.TensorSpec([3, 6, 6] if static else [None, None, None], tf.float64)

    @tf.function(input_signature=[spec])
    def both(A):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(A)
            mine = tf.reduce_sum(safe_cholesky(A) * upstream)
            ref = tf.reduce_sum(tf.linalg.cholesky(A) * upstream)
        return tape.gradient(mine, A), tape.gradient(ref, A)

    mine, ref = both(tf.constant(A))
    np.testing.assert_allclose(mine.numpy(), ref.numpy(), rtol=1e-12, atol=1e-14)


def test_compiled_ladder():
    assert linalg.compiled_ladder(6) == [0, 3, 5]
    assert linalg.compiled_ladder(1) == [0]
    assert linalg.compiled_ladder(0) == []


@pytest.mark.parametrize("jit_compile", [None, False, True], ids=["eager", "graph", "xla"])
@pytest.mark.parametrize("static", [True, False], ids=["static_n", "dynamic_n"])
def test_add_jitter_adds_a_diagonal_with_its_gradient(rng, jit_compile, static):
    """``add_jitter(A, j)`` is ``A + j I`` per batch member, for a scalar and a per-member ``j``,
    with the gradient of that sum (``dA`` passes through, ``dj`` is the trace of the upstream),
    eagerly, compiled and under XLA, with the matrix size known or not at trace time."""
    A = rng.normal(size=(2, 3, 4, 4))
    j = np.abs(rng.normal(size=(2, 3)))
    W = rng.normal(size=A.shape)

    def value_and_grads(A, j):
        with tf.GradientTape() as tape:
            tape.watch([A, j])
            out = linalg.add_jitter(A, j)
            scalar = linalg.add_jitter(A, j[0, 0])
            loss = tf.reduce_sum(W * out) + tf.reduce_sum(W * scalar)
        return (out, scalar) + tuple(tape.gradient(loss, [A, j]))

    fn = value_and_grads
    if jit_compile is not None:
        spec = [
            tf.TensorSpec([2, 3, 4, 4] if static else [2, 3, None, None], tf.float64),
            tf.TensorSpec([2, 3], tf.float64),
        ]
        fn = tf.function(value_and_grads, input_signature=spec, jit_compile=jit_compile)
    out, scalar, dA, dj = (t.numpy() for t in fn(tf.constant(A), tf.constant(j)))
    eye = np.eye(4)
    np.testing.assert_allclose(out, A + j[..., None, None] * eye, rtol=1e-15)
    np.testing.assert_allclose(scalar, A + j[0, 0] * eye, rtol=1e-15)
    np.testing.assert_allclose(dA, 2 * W, rtol=1e-15)
    trace = np.trace(W, axis1=-2, axis2=-1)
    expected = trace.copy()
    expected[0, 0] += trace.sum()
    np.testing.assert_allclose(dj, expected, rtol=1e-12)


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_host_branch_tries_the_whole_ladder_only_when_a_member_fails(rng, jit_compile):
    """With no GPU visible, a compiled step (plain or XLA) factorises once when every member is
    positive definite (the retries sit behind a ``tf.cond``) and otherwise tries every rung, as
    eagerly: a member that needs relative jitter 1e-7 (k = 1, not on the branch-free ladder
    ``[0, 3, 5]``) gets 1e-7, not 1e-5."""
    n = 6
    members = [_with_min_eigenvalue(rng, n, 0.5), _with_min_eigenvalue(rng, n, -5e-8)]
    A = np.stack(members)

    @linalg.checked_function(jit_compile=jit_compile)
    def factor(A):
        return safe_cholesky(A)

    L = factor(tf.constant(A)).numpy()
    scale = np.mean(np.abs(np.diagonal(A, axis1=-2, axis2=-1)), axis=-1)
    added = (
        np.mean(np.diagonal(L @ np.transpose(L, (0, 2, 1)) - A, axis1=-2, axis2=-1), axis=-1)
        / scale
    )
    np.testing.assert_allclose(added, [0.0, 1e-7], rtol=1e-4, atol=1e-12)

    def checked(A):
        with linalg.cholesky_checks() as checks:
            return safe_cholesky(A), checks.status()

    graph = (
        tf.function(checked, jit_compile=jit_compile)
        .get_concrete_function(tf.TensorSpec(A.shape, tf.float64))
        .graph
    )
    assert [op.type for op in graph.get_operations()].count("StatelessIf") == 1


def _with_min_eigenvalue(rng, n, lowest):
    """A symmetric ``n x n`` matrix with eigenvalues ``lowest, 1, ..., 1`` (mean diagonal ~1)."""
    Q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    return (Q * np.r_[lowest, np.ones(n - 1)]) @ Q.T


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_accelerator_ladder_keeps_each_members_first_working_jitter(rng, jit_compile):
    """The branch-free ladder a GPU step runs, plain or XLA (``compiled_ladder(6) = [0, 3, 5]``:
    relative jitters 1e-8, 1e-5, 1e-3), batched into one factorisation: every member gets the
    smallest jitter of the ladder that makes it positive definite, a member that needs none gets
    none, and a member no jitter repairs is reported."""
    n = 6
    members = [
        _with_min_eigenvalue(rng, n, 0.5),  # fine as it is
        _with_min_eigenvalue(rng, n, -5e-6),  # needs 1e-5 (k = 3)
        _with_min_eigenvalue(rng, n, -5e-4),  # needs 1e-3 (k = 5)
        _with_min_eigenvalue(rng, n, -3e-9),
    ]  # needs 1e-8 (k = 0)
    A = np.stack(members)

    @linalg.checked_function(jit_compile=jit_compile)
    def factor(A):
        return safe_cholesky(A)

    with linalg.accelerator_branch():
        L = factor(tf.constant(A)).numpy()
    scale = np.mean(np.abs(np.diagonal(A, axis1=-2, axis2=-1)), axis=-1)
    added = (
        np.mean(np.diagonal(L @ np.transpose(L, (0, 2, 1)) - A, axis1=-2, axis2=-1), axis=-1)
        / scale
    )
    np.testing.assert_allclose(added, [0.0, 1e-5, 1e-3, 1e-8], rtol=1e-4, atol=1e-12)
    np.testing.assert_allclose(L[0], np.linalg.cholesky(members[0]), rtol=1e-12)
    with pytest.raises(CholeskyError, match="not positive definite"), linalg.accelerator_branch():
        factor(tf.constant(np.stack(members[:3] + [_with_min_eigenvalue(rng, n, -0.5)])))
