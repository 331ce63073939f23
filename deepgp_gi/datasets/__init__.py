"""Benchmark and toy data sets, one module per kind.

* :mod:`~deepgp_gi.datasets.uci`: UCI regression benchmarks with the standard train/test splits
  (20 per data set, 5 for protein), bundled as ``deepgp_gi/data/uci/<name>.npz`` (see
  ``LICENSE.md`` there for the sources and licence). :func:`load_uci` returns one split
  normalised with the training points' mean and standard deviation, as in the deep GP / BNN
  literature; ``protocol="extrapolation"`` gives Lindinger et al.'s split instead.
* :mod:`~deepgp_gi.datasets.images`: images, returned in the same :class:`UCIDataset` object with
  inputs ``[N, H, W, C]`` in [0, 1] and integer class labels ``[N, 1]``: the 8x8 handwritten
  digits, bundled as ``deepgp_gi/data/digits/`` (see ``LICENSE.md`` there), with 20 seeded
  stratified splits (:func:`load_digits`); readers for MNIST and CIFAR-10 files the user already
  has (:func:`read_mnist_idx`, :func:`load_cifar10`).
* :mod:`~deepgp_gi.datasets.mnist`: :func:`load_mnist` reads MNIST where
  ``python tools/fetch_mnist.py`` put it (``~/.cache/deepgp_gi/mnist.npz`` or ``$DEEPGP_GI_DATA``),
  with no argument, or a file or folder it is given.
* :mod:`~deepgp_gi.datasets.toys`: :func:`gap_regression` (the 1D "gap" data of Ober & Aitchison,
  2021) and :func:`deep_linear` (Bayesian linear regression with a closed-form evidence,
  :func:`deep_linear_log_evidence`).
* :mod:`~deepgp_gi.datasets.shards`: data sets larger than memory, written to TFRecord shards
  (:func:`write_shards`) and streamed back with ``tf.data`` (:func:`read_shards`).
* :mod:`~deepgp_gi.datasets.base`: :class:`UCIDataset`, the split every loader returns.

All but the shards are plain NumPy (float64).
"""

from .base import UCIDataset
from .images import (
    DIGITS_SPLITS,
    digits_split,
    load_cifar10,
    load_digits,
    load_digits_raw,
    read_mnist_idx,
    standardise_images,
)
from .mnist import (
    MNIST_FETCH_COMMAND,
    MNIST_LABEL_COUNTS,
    data_home,
    default_mnist_path,
    load_mnist,
)
from .shards import read_shards, shard_info, write_shards
from .toys import DeepLinearData, deep_linear, deep_linear_log_evidence, gap_regression
from .uci import (
    PROTOCOLS,
    UCI_FOLDERS,
    UCI_NAMES,
    extrapolation_split,
    load_uci,
    load_uci_raw,
    random_80_20_split,
    seeded_random_split,
)

__all__ = [
    "UCI_NAMES",
    "UCI_FOLDERS",
    "UCIDataset",
    "load_uci",
    "load_uci_raw",
    "extrapolation_split",
    "random_80_20_split",
    "seeded_random_split",
    "PROTOCOLS",
    "DIGITS_SPLITS",
    "load_digits",
    "load_digits_raw",
    "standardise_images",
    "digits_split",
    "load_mnist",
    "read_mnist_idx",
    "MNIST_FETCH_COMMAND",
    "MNIST_LABEL_COUNTS",
    "data_home",
    "default_mnist_path",
    "load_cifar10",
    "write_shards",
    "read_shards",
    "shard_info",
    "gap_regression",
    "DeepLinearData",
    "deep_linear",
    "deep_linear_log_evidence",
]
