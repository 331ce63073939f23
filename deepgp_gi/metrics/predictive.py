"""Metrics of a model's predictive distribution on test data.

Regression, in the papers' protocol: targets are standardised for training; the metrics are
reported in the original units (``y_std`` undoes the scaling): :func:`test_log_likelihood`,
:func:`rmse`, :func:`evaluate_dataset`.

Calibration of regression (Lindinger et al. 2020, Fig. 3): :func:`predictive_cdf` gives each test
target's value of the predictive mixture's CDF (its probability integral transform), and
:func:`calibration_curve` the fraction of targets inside each central predictive interval.

Classification (a ``Softmax``, ``MultiClass`` or ``Bernoulli`` likelihood): the predictive class
probabilities ``p(y = c | x)`` of the Monte Carlo mixture (:func:`predict_class_probabilities`),
and on them :func:`accuracy`, :func:`ece` (expected calibration error) and
:func:`predictive_entropy`; the same metrics on arrays are :func:`top1_accuracy`,
:func:`expected_calibration_error` and :func:`categorical_entropy`. :func:`test_log_likelihood`
is the classification test log-likelihood too (``mean_n log p(y_n | x_n)`` through
``predict_log_density``; leave ``y_std = 1``).

Inputs are sliced along their first axis only, so any input layout the model accepts (``[N, D]``,
images ``[N, H, W, C]``) works; the model checks them.
"""

from __future__ import annotations

import gpflow
import numpy as np
import tensorflow as tf

from ..likelihoods import mixture_mean
from ..validation import check_finite_array, check_positive_float, check_positive_int, check_seed

__all__ = [
    "test_log_likelihood",
    "constant_gaussian_test_ll",
    "pointwise_log_density",
    "predictive_cdf",
    "calibration_curve",
    "rmse",
    "predict_in_chunks",
    "chunk_seed",
    "evaluate_dataset",
    "predict_class_probabilities",
    "accuracy",
    "ece",
    "predictive_entropy",
    "top1_accuracy",
    "expected_calibration_error",
    "categorical_entropy",
]

#: Rows of class probabilities must sum to 1 within this tolerance (or ``C`` machine epsilons of
#: their dtype, if larger: float32 softmax outputs of many classes).
ROW_SUM_TOLERANCE = 1e-6


def predict_in_chunks(fn, X, chunk_size: int = 1000):
    """Apply ``fn`` to row chunks of ``X`` and concatenate along the point axis.

    Each chunk is a fresh Monte Carlo estimate; for the per-point metrics below this is exactly
    as valid as one pass (every point's predictive mixture has the same distribution).
    """
    chunk_size = check_positive_int(chunk_size, "chunk_size")
    outs = [fn(slice(i, min(i + chunk_size, len(X)))) for i in range(0, len(X), chunk_size)]
    return np.concatenate(outs, axis=-1 if np.ndim(outs[0]) == 1 else -2)


def chunk_seed(seed, start: int, chunk_size: int):
    """The seed of the chunk of rows starting at ``start``: ``seed`` itself for the first chunk
    (so one chunk draws exactly what ``model.predict_y(X, S, seed=seed)`` draws), a seed derived
    from ``(seed, chunk index)`` for the others (independent draws per chunk), ``None`` for
    ``None`` (fresh draws)."""
    k = start // chunk_size
    if seed is None or k == 0:
        return seed
    return tf.random.experimental.stateless_fold_in(tf.constant([seed, 0], tf.int64), k)


def _in_seeded_chunks(fn, X, chunk_size: int, seed):
    """:func:`predict_in_chunks` of ``fn(rows, chunk's seed)``: ``rows`` a slice of ``X``'s
    first axis, the seed :func:`chunk_seed`'s for the chunk's first row."""
    return predict_in_chunks(lambda s: fn(s, chunk_seed(seed, s.start, chunk_size)), X, chunk_size)


def test_log_likelihood(
    model,
    X_test,
    Y_test,
    y_std: float = 1.0,
    num_samples: int = 100,
    chunk_size: int = 1000,
    seed=None,
):
    """Mean log predictive density per test point, in the original units of Y.

    ``log p(y_raw) = log p(y) - log y_std`` for targets standardised as ``(y_raw - m) / y_std``.
    For classification (``Y_test`` class labels ``[N, 1]``, ``y_std = 1``) this is the mean
    ``log p(y_n | x_n)`` of the predictive mixture, i.e. minus the test NLL. ``seed``: ``None``
    (fresh draws) or an int (reproducible; see :func:`chunk_seed`).
    """
    return float(
        np.mean(pointwise_log_density(model, X_test, Y_test, y_std, num_samples, chunk_size, seed))
    )


def constant_gaussian_test_ll(Y_train, Y_test, y_std: float = 1.0) -> float:
    """The test LL of the model that ignores the inputs: one Gaussian with the training targets'
    mean and (maximum-likelihood) variance, per test point in the original units of Y (as
    :func:`test_log_likelihood`, for targets standardised with ``y_std``).

    A deep GP whose fit collapsed to the noise scores this number: it is the floor any regression
    row should clear. ``Y_train`` ``[N, 1]`` and ``Y_test`` ``[N*, 1]``, finite and non-empty.
    """
    Y_train = check_finite_array(Y_train, "Y_train", ndim=2)
    Y_test = check_finite_array(Y_test, "Y_test", ndim=2)
    y_std = check_positive_float(y_std, "y_std")
    for arr, name, least in ((Y_train, "Y_train", 2), (Y_test, "Y_test", 1)):
        if arr.shape[0] < least or arr.shape[1] != 1:
            raise ValueError(
                f"{name} must be [N, 1] with N >= {least}, got shape {list(arr.shape)}"
            )
    mean, var = float(np.mean(Y_train)), float(np.var(Y_train))
    if var <= 0:
        raise ValueError("Y_train is constant: a Gaussian fit to it has no variance")
    lpd = -0.5 * np.log(2 * np.pi * var) - 0.5 * (Y_test - mean) ** 2 / var
    return float(np.mean(lpd)) - float(np.log(y_std))


def pointwise_log_density(
    model,
    X_test,
    Y_test,
    y_std: float = 1.0,
    num_samples: int = 100,
    chunk_size: int = 1000,
    seed=None,
) -> np.ndarray:
    """``[N]``: each test point's log predictive density in the original units of Y
    (:func:`test_log_likelihood` is their mean; arguments as there)."""
    X, Y, num_samples, seed = _test_arguments(model, X_test, Y_test, y_std, num_samples, seed)
    lpd = _in_seeded_chunks(
        lambda s, k: model.predict_log_density((X[s], Y[s]), num_samples, k).numpy(),
        X,
        chunk_size,
        seed,
    )
    return lpd - np.log(y_std)


def predictive_cdf(
    model, X_test, Y_test, num_samples: int = 100, chunk_size: int = 1000, seed=None
) -> np.ndarray:
    """``[N]``: the predictive mixture's CDF at each test target (its probability integral
    transform).

    For a Gaussian likelihood the predictive is the equal-weight mixture over ``num_samples``
    samples of ``N(mean_s, var_s + noise)``, so the CDF is ``mean_s Phi((y - mean_s) / sd_s)``
    (weighted by the family's mixture weights where it has them). A
    calibrated predictor gives uniform values. Standardising Y does not change them. Needs one
    output column (``Y_test`` ``[N, 1]``) and a ``gpflow.likelihoods.Gaussian`` likelihood.
    """
    num_samples = check_positive_int(num_samples, "num_samples")
    seed = check_seed(seed, "seed")
    if not isinstance(model.likelihood, gpflow.likelihoods.Gaussian):
        raise TypeError(
            "predictive_cdf needs a Gaussian likelihood, the model has "
            f"{type(model.likelihood).__name__}"
        )
    X, Y = model.check_data((X_test, Y_test), names=("X_test", "Y_test"))
    if Y.shape[-1] != 1:
        raise ValueError(
            f"Y_test must have one column for predictive_cdf, got shape {tuple(Y.shape)}"
        )
    X, Y = X.numpy(), Y.numpy()

    def chunk(s, rows_seed):
        mean, var = model.predict_f_components(X[s], num_samples, rows_seed)
        noise = model.likelihood.variance_at(
            tf.constant(X[s])
        )  # [N, 1], constant or heteroscedastic
        sd = tf.sqrt(var + noise[None])
        z = (tf.constant(Y[s], sd.dtype)[None] - mean) / sd
        cdf = 0.5 * tf.math.erfc(-z / np.sqrt(2.0))  # [S, N, 1]
        return mixture_mean(cdf, model.posterior.mixture_log_weights())[:, 0].numpy()

    return _in_seeded_chunks(chunk, X, chunk_size, seed)


def calibration_curve(pit, levels=None):
    """Observed coverage of central predictive intervals, from :func:`predictive_cdf` values.

    A target lies inside the central interval of probability ``p`` when ``|u - 1/2| <= p/2`` for its
    CDF value ``u``. A calibrated predictor's observed coverage equals ``p``; an overconfident one's
    is below it.

    :param pit: ``[N]`` CDF values in [0, 1].
    :param levels: interval probabilities in (0, 1]; default 0.05, 0.10, ..., 1.0.
    :return: ``(levels [K], observed [K])``.
    """
    pit = check_finite_array(pit, "pit")
    if pit.ndim != 1 or pit.size == 0:
        raise ValueError(f"pit must be a non-empty 1-D array, got shape {pit.shape}")
    if np.any(pit < 0) or np.any(pit > 1):
        raise ValueError("pit values must lie in [0, 1]")
    levels = np.linspace(0.05, 1.0, 20) if levels is None else check_finite_array(levels, "levels")
    if levels.ndim != 1 or np.any(levels <= 0) or np.any(levels > 1):
        raise ValueError("levels must be a 1-D array of probabilities in (0, 1]")
    inside = np.abs(pit[None, :] - 0.5) <= levels[:, None] / 2 + 1e-12
    return levels, inside.mean(axis=1)


def rmse(
    model,
    X_test,
    Y_test,
    y_std: float = 1.0,
    num_samples: int = 100,
    chunk_size: int = 1000,
    seed=None,
):
    """Root-mean-square error of the predictive mixture mean, in the original units of Y
    (``seed`` as in :func:`test_log_likelihood`)."""
    X, Y, num_samples, seed = _test_arguments(model, X_test, Y_test, y_std, num_samples, seed)
    mean = _predictive_mean(model, X, num_samples, chunk_size, seed)
    return float(y_std * np.sqrt(np.mean(np.square(Y - mean))))


def _predictive_mean(model, X, num_samples, chunk_size, seed) -> np.ndarray:
    """``[N, P]``: ``model.predict_y``'s mean of the rows of ``X``, in chunks of ``chunk_size``
    rows (seeds by :func:`chunk_seed`)."""
    return _in_seeded_chunks(
        lambda s, k: model.predict_y(X[s], num_samples, k)[0].numpy(), X, chunk_size, seed
    )


def evaluate_dataset(
    model, dataset, y_std: float = 1.0, num_samples: int = 100, progress: bool = True
):
    """Test log-likelihood and RMSE over a ``tf.data.Dataset`` of ``(X, Y)`` batches (e.g.
    :func:`deepgp_gi.datasets.read_shards` with ``shuffle=False``), in original units, without
    holding the data in memory: per-point sums are accumulated batch by batch, with a tqdm bar.

    :return: ``{"test_ll": mean log predictive density, "rmse": ..., "num_points": N}``; equal to
        :func:`test_log_likelihood` / :func:`rmse` on the concatenated data up to Monte Carlo
        error (each batch draws its own samples).
    """
    from tqdm.auto import tqdm

    num_samples = check_positive_int(num_samples, "num_samples")
    _check_scale(y_std)
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(
            f"dataset must be a tf.data.Dataset of (X, Y) batches, got {type(dataset).__name__}"
        )
    total_lpd, total_sq, count = 0.0, 0.0, 0
    with tqdm(desc="evaluate", unit="pt", disable=not progress, dynamic_ncols=True) as bar:
        for X_b, Y_b in dataset:
            X_b, Y_b = model.check_data((X_b, Y_b), names=("X (batch)", "Y (batch)"))
            total_lpd += float(tf.reduce_sum(model.predict_log_density((X_b, Y_b), num_samples)))
            mean = model.predict_y(X_b, num_samples)[0]
            total_sq += float(tf.reduce_sum(tf.square(Y_b - mean)))
            count += int(X_b.shape[0])
            bar.update(int(X_b.shape[0]))
    if count == 0:
        raise ValueError("dataset yielded no rows")
    return {
        "test_ll": total_lpd / count - float(np.log(y_std)),
        "rmse": float(y_std * np.sqrt(total_sq / count)),
        "num_points": count,
    }


def _check_scale(y_std):
    if not (np.ndim(y_std) == 0 and np.isfinite(y_std) and y_std > 0):
        raise ValueError(f"y_std must be a positive finite number, got {y_std!r}")


def _test_arguments(model, X_test, Y_test, y_std, num_samples, seed):
    """The checked arguments of a regression metric: ``(X [N, D], Y [N, P])`` as NumPy arrays of the
    model's dtype, ``num_samples`` and ``seed``."""
    num_samples = check_positive_int(num_samples, "num_samples")
    seed = check_seed(seed, "seed")
    _check_scale(y_std)
    X, Y = model.check_data((X_test, Y_test), names=("X_test", "Y_test"))
    return X.numpy(), Y.numpy(), num_samples, seed


# ---------------------------------------------------------------------------------- classification
def predict_class_probabilities(
    model, X, num_samples: int = 100, chunk_size: int = 1000, seed=None
) -> np.ndarray:
    """Predictive class probabilities ``[N, C]``: ``p(y = c | x) = (1/S) sum_s E[p(y = c | f_s)]``.

    This is ``model.predict_y(X, num_samples)[0]``, the mean of the predictive mixture, for a
    ``Softmax`` (``E[softmax(f)]`` over the model's samples ``f_s``: the last layer's sample
    drawn with the model's seeded noise; see ``DeepGP.likelihood_moments``) or
    ``MultiClass`` likelihood (robust-max, by quadrature; GPflow clips the normal CDFs inside it to
    ``[1e-4, 1 - 1e-4]``, so its rows sum to 1 only approximately and are renormalised here); for
    ``Bernoulli`` (one column ``p = p(y = 1)``) it is ``[1 - p, p]``, two classes.

    :param X: inputs, sliced into chunks of ``chunk_size`` rows along the first axis only (the
        model validates each chunk's layout).
    :param seed: ``None`` (fresh draws) or an int (reproducible draws; one chunk draws what
        ``model.predict_y(X, num_samples, seed=seed)`` draws, see :func:`chunk_seed`). For GPflow's
        Monte Carlo likelihoods (``Softmax``) the model hands over its own seeded last-layer
        sample, so the probabilities are determined by ``seed`` for every family.
    :raises TypeError: the likelihood is not a classification likelihood.
    """
    kind = _classification_kind(model)
    renormalise = isinstance(model.likelihood, gpflow.likelihoods.MultiClass)
    num_samples = check_positive_int(num_samples, "num_samples")
    chunk_size = check_positive_int(chunk_size, "chunk_size")
    seed = check_seed(seed, "seed")
    X = _as_numpy(X)
    if len(X) == 0:
        raise ValueError("X is empty (0 rows)")

    mean = _predictive_mean(model, X, num_samples, chunk_size, seed)
    if kind == "bernoulli":
        return np.concatenate([1.0 - mean, mean], axis=-1)
    return mean / mean.sum(axis=-1, keepdims=True) if renormalise else mean


def accuracy(
    model, X_test, Y_test, num_samples: int = 100, chunk_size: int = 1000, seed=None
) -> float:
    """Fraction of test points whose most probable class (:func:`predict_class_probabilities`)
    is the label ``Y_test`` (``[N, 1]`` class labels, 0/1 for ``Bernoulli``)."""
    probs, labels = _probabilities_and_labels(model, X_test, Y_test, num_samples, chunk_size, seed)
    return top1_accuracy(probs, labels)


def ece(
    model,
    X_test,
    Y_test,
    num_samples: int = 100,
    num_bins: int = 15,
    chunk_size: int = 1000,
    seed=None,
) -> float:
    """Expected calibration error (:func:`expected_calibration_error`) of the predictive class
    probabilities on ``(X_test, Y_test)``, with ``num_bins`` equal-width confidence bins."""
    num_bins = check_positive_int(num_bins, "num_bins")
    probs, labels = _probabilities_and_labels(model, X_test, Y_test, num_samples, chunk_size, seed)
    return expected_calibration_error(probs, labels, num_bins)


def predictive_entropy(
    model,
    X_test,
    num_samples: int = 100,
    chunk_size: int = 1000,
    seed=None,
    per_point: bool = False,
):
    """Entropy (nats) of the predictive class distribution, averaged over the test points (a
    float), or per point (``[N]`` array) with ``per_point=True``. It is the total predictive
    uncertainty: ``log C`` for uniform predictions, 0 for certain ones."""
    if not isinstance(per_point, (bool, np.bool_)):
        raise TypeError(f"per_point must be True or False, got {per_point!r}")
    _classification_kind(model)
    X = model.check_inputs(_as_numpy(X_test), "X_test").numpy()
    entropy = categorical_entropy(
        predict_class_probabilities(model, X, num_samples, chunk_size, seed)
    )
    return entropy if per_point else float(np.mean(entropy))


def top1_accuracy(probs, labels) -> float:
    """Fraction of rows of ``probs [N, C]`` whose largest entry is at the column ``labels [N]``
    (or ``[N, 1]``); ties go to the lowest class index (``np.argmax``)."""
    probs = _check_probabilities(probs)
    labels = _check_labels(labels, probs.shape)
    return float(np.mean(np.argmax(probs, axis=1) == labels))


def expected_calibration_error(probs, labels, num_bins: int = 15) -> float:
    """Expected calibration error with equal-width confidence bins (Guo et al. 2017).

    Each row's confidence is its largest probability and its prediction the class with it
    (``np.argmax``); rows are binned by confidence into ``((b-1)/B, b/B]``, ``b = 1..B``, and

    ``ECE = sum_b |B_b| / N * |accuracy(B_b) - mean confidence(B_b)|``   (empty bins add 0).

    :param probs: ``[N, C]`` class probabilities: finite, in ``[0, 1]``, rows summing to 1 within
        1e-6 (``ROW_SUM_TOLERANCE``), or ``C`` machine epsilons of their dtype if larger.
    :param labels: ``[N]`` or ``[N, 1]`` integer class labels in ``[0, C)`` (integer-valued floats
        are accepted, as the model's ``Y``).
    :param num_bins: ``B``, a positive integer.
    """
    num_bins = check_positive_int(num_bins, "num_bins")
    probs = _check_probabilities(probs)
    labels = _check_labels(labels, probs.shape)
    confidence = np.max(probs, axis=1)
    correct = (np.argmax(probs, axis=1) == labels).astype(np.float64)
    inner_edges = np.linspace(0.0, 1.0, num_bins + 1)[1:-1]
    bins = np.digitize(confidence, inner_edges, right=True)  # bin b holds (edge[b], edge[b+1]]
    gap = np.bincount(bins, weights=correct - confidence, minlength=num_bins)  # sum of (acc - conf)
    return float(np.sum(np.abs(gap)) / len(labels))


def categorical_entropy(probs) -> np.ndarray:
    """``[N]`` entropies ``-sum_c p_c log p_c`` (nats, ``0 log 0 = 0``) of the rows of
    ``probs [N, C]`` (checked as in :func:`expected_calibration_error`)."""
    probs = _check_probabilities(probs)
    logs = np.log(np.where(probs > 0, probs, 1.0))
    return -np.sum(probs * logs, axis=1)


def _classification_kind(model) -> str:
    likelihood = getattr(model, "likelihood", None)
    if isinstance(likelihood, (gpflow.likelihoods.Softmax, gpflow.likelihoods.MultiClass)):
        return "categorical"
    if isinstance(likelihood, gpflow.likelihoods.Bernoulli):
        return "bernoulli"
    raise TypeError(
        "class probabilities need a model with a Softmax, MultiClass or Bernoulli likelihood; "
        f"this model has {type(likelihood).__name__} (for regression use test_log_likelihood and "
        "rmse)"
    )


def _probabilities_and_labels(model, X_test, Y_test, num_samples, chunk_size, seed):
    _classification_kind(model)
    X, Y = model.check_data((X_test, Y_test), names=("X_test", "Y_test"))
    probs = predict_class_probabilities(model, X.numpy(), num_samples, chunk_size, seed)
    return probs, Y.numpy()[:, 0]


def _as_numpy(X):
    return X.numpy() if isinstance(X, (tf.Tensor, tf.Variable)) else np.asarray(X)


def _check_probabilities(probs, name: str = "probs") -> np.ndarray:
    dtype = np.asarray(probs).dtype
    probs = check_finite_array(probs, name, ndim=2)
    N, C = probs.shape
    if N == 0 or C == 0:
        raise ValueError(f"{name} is empty (shape {list(probs.shape)})")
    outside = (probs < 0) | (probs > 1)
    if outside.any():
        row = int(np.nonzero(outside.any(axis=1))[0][0])
        raise ValueError(f"{name} must lie in [0, 1]; row {row} has {probs[row].tolist()}")
    tolerance = ROW_SUM_TOLERANCE
    if dtype.kind == "f":
        tolerance = max(tolerance, C * float(np.finfo(dtype).eps))
    off = np.abs(probs.sum(axis=1) - 1.0) > tolerance
    if off.any():
        row = int(np.nonzero(off)[0][0])
        raise ValueError(
            f"{name} rows must sum to 1 within {tolerance:g}; row {row} sums to "
            f"{probs[row].sum()!r}"
        )
    return probs


def _check_labels(labels, probs_shape, name: str = "labels") -> np.ndarray:
    N, C = probs_shape
    if isinstance(labels, (tf.Tensor, tf.Variable)):
        labels = labels.numpy()
    arr = np.asarray(labels)
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{name} must hold integer class labels, got dtype {arr.dtype}")
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise ValueError(f"{name} must have shape [N] or [N, 1], got {list(arr.shape)}")
    if len(arr) != N:
        raise ValueError(f"{name} has {len(arr)} entries but probs has {N} rows")
    bad = ~np.isfinite(arr) | (arr != np.round(arr)) | (arr < 0) | (arr >= C)
    if bad.any():
        row = int(np.nonzero(bad)[0][0])
        raise ValueError(
            f"{name} must be integers in [0, {C}) for {C} classes; entry {row} is {arr[row]!r}"
        )
    return arr.astype(np.int64)
