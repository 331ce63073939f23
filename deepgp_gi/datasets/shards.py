"""Data sets larger than memory: rows written to TFRecord shards and streamed back with tf.data.

``write_shards(X, Y, directory, num_shards)`` stores the rows in order, contiguous blocks per
shard, each value exactly (the raw bytes of the float64 or float32 arrays, not a float32
``FloatList``), with a ``shards.json`` describing them. ``read_shards(directory, batch_size, ...)``
gives a ``tf.data.Dataset`` of ``(X_b, Y_b)`` batches that ``fit`` trains on (with
``model.num_data = shard_info(directory)["num_rows"]``); with ``shuffle=False`` the rows come
back in the order written, so a streamed fit equals the in-memory fit on the same batches.
Both functions are re-exported by :mod:`deepgp_gi.datasets`.
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf

from ..validation import as_data_array, check_data_pair, check_positive_int, check_seed

__all__ = ["write_shards", "read_shards", "shard_info", "SHARD_INDEX"]

#: The file in a shard directory that describes the shards.
SHARD_INDEX = "shards.json"


def _example(x: np.ndarray, y: np.ndarray) -> bytes:
    feature = {
        "x": tf.train.Feature(bytes_list=tf.train.BytesList(value=[x.tobytes()])),
        "y": tf.train.Feature(bytes_list=tf.train.BytesList(value=[y.tobytes()])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_shards(X, Y, directory, num_shards: int = 8, dtype=np.float64) -> List[str]:
    """Write the rows of ``(X, Y)`` to ``num_shards`` TFRecord files in ``directory``.

    :param X: inputs ``[N, D]``.
    :param Y: targets ``[N, P]``.
    :param directory: created if missing; must not already hold shards.
    :param num_shards: number of files (at most N); shard ``k`` holds a contiguous block of rows.
    :param dtype: stored precision, ``np.float64`` (default) or ``np.float32``.
    :return: the shard paths, in row order.
    """
    dtype = np.dtype(dtype)
    if dtype not in (np.float64, np.float32):
        raise ValueError(f"dtype must be float64 or float32, got {dtype}")
    tf_dtype = tf.as_dtype(dtype)
    Xt = as_data_array(X, "X", tf_dtype)
    Yt = as_data_array(Y, "Y", tf_dtype)
    check_data_pair(Xt, Yt)
    Xa, Ya = Xt.numpy(), Yt.numpy()
    N = Xa.shape[0]
    num_shards = check_positive_int(num_shards, "num_shards")
    if num_shards > N:
        raise ValueError(f"num_shards={num_shards} exceeds the number of rows N={N}")
    directory = os.fspath(directory)
    if os.path.exists(os.path.join(directory, SHARD_INDEX)):
        raise ValueError(f"directory {directory} already holds shards ({SHARD_INDEX} exists)")
    os.makedirs(directory, exist_ok=True)
    bounds = np.linspace(0, N, num_shards + 1).astype(int)
    paths, counts = [], []
    for k in range(num_shards):
        name = f"shard-{k:05d}-of-{num_shards:05d}.tfrecord"
        path = os.path.join(directory, name)
        with tf.io.TFRecordWriter(path) as writer:
            for i in range(bounds[k], bounds[k + 1]):
                writer.write(_example(Xa[i], Ya[i]))
        paths.append(path)
        counts.append(int(bounds[k + 1] - bounds[k]))
    info = dict(
        num_rows=int(N),
        input_dim=int(Xa.shape[1]),
        output_dim=int(Ya.shape[1]),
        dtype=dtype.name,
        shards=[os.path.basename(p) for p in paths],
        rows_per_shard=counts,
    )
    with open(os.path.join(directory, SHARD_INDEX), "w") as fh:
        json.dump(info, fh, indent=1)
    return paths


def shard_info(directory) -> Dict:
    """The description written by :func:`write_shards`: ``num_rows``, ``input_dim``,
    ``output_dim``, ``dtype``, ``shards`` (file names in row order), ``rows_per_shard``."""
    path = os.path.join(os.fspath(directory), SHARD_INDEX)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{directory} holds no shards ({SHARD_INDEX} is missing); write them with write_shards"
        )
    with open(path) as fh:
        return json.load(fh)


def read_shards(
    directory,
    batch_size: int,
    shuffle: bool = True,
    seed: Optional[int] = None,
    shuffle_buffer: int = 10_000,
    repeat: bool = False,
) -> tf.data.Dataset:
    """Stream ``(X_b, Y_b)`` batches from shards written by :func:`write_shards`.

    :param directory: the shard directory.
    :param batch_size: rows per batch (the last batch of a pass may be smaller).
    :param shuffle: shuffle the shard order and the rows (through a buffer of ``shuffle_buffer``
        rows, so memory stays bounded); ``False`` yields the rows exactly in the order written.
    :param seed: seeds the shuffles (reproducible passes); ``None`` draws fresh orders.
    :param repeat: repeat forever (``fit`` repeats a finite dataset itself).
    :return: a ``tf.data.Dataset`` of ``([B, D], [B, P])`` tensors in the stored dtype.
    """
    info = shard_info(directory)
    batch_size = check_positive_int(batch_size, "batch_size")
    shuffle_buffer = check_positive_int(shuffle_buffer, "shuffle_buffer")
    seed = check_seed(seed)
    dtype = tf.as_dtype(info["dtype"])
    D, P = info["input_dim"], info["output_dim"]
    files = [os.path.join(os.fspath(directory), name) for name in info["shards"]]
    missing = [f for f in files if not os.path.exists(f)]
    if missing:
        raise FileNotFoundError(f"shard files missing: {missing[:3]}")
    spec = {"x": tf.io.FixedLenFeature([], tf.string), "y": tf.io.FixedLenFeature([], tf.string)}

    def parse(record):
        row = tf.io.parse_single_example(record, spec)
        x = tf.reshape(tf.io.decode_raw(row["x"], dtype), [D])
        y = tf.reshape(tf.io.decode_raw(row["y"], dtype), [P])
        return x, y

    files_ds = tf.data.Dataset.from_tensor_slices(files)
    if shuffle:
        files_ds = files_ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    ds = files_ds.interleave(
        tf.data.TFRecordDataset,
        cycle_length=1 if not shuffle else min(4, len(files)),
        deterministic=True,
    )
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if shuffle:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    return ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)
