"""Collective keys of the ``tf.distribute`` strategies ``fit`` trains under, kept apart.

A strategy that all-reduces with collective ops (``MirroredStrategy`` on CPUs or GPUs,
``MultiWorkerMirroredStrategy``) names each all-reduce by a group key (its set of devices) and an
instance key, drawn from a counter of that strategy's own: every strategy starts at group key 1
and instance key 100. TensorFlow's runtime keeps what it learnt of an instance (the shape of its
tensors) for the life of the process, so a second strategy over the same devices reuses the
first one's instance keys for other tensors, and its first all-reduce fails ("Shape mismatch in
the collective instance 100 ... expected shape [948] but another member in the group expected
shape [94]"), which also aborts every later collective of the process.

:func:`separate_collective_keys` moves a strategy's instance counters past every instance key
that any strategy handed to it so far has drawn, before that strategy's step draws its first one,
and the key of any group it forms later past every group key they have used. Every worker of a
``MultiWorkerMirroredStrategy`` runs the same program, so the workers move their counters alike
and still agree on every key. Keys a strategy draws outside ``fit`` before its first ``fit`` (a
``MultiWorkerMirroredStrategy`` broadcasting initial values while a model is built) are drawn
before any move and cannot be kept apart this way.
"""

from __future__ import annotations

import threading

import tensorflow as tf

__all__ = ["separate_collective_keys"]

# the key counters (TensorFlow's ``CollectiveKeys``) of every strategy seen, held strongly: the
# runtime remembers a dead strategy's instances too
_SEEN: list = []
_LOCK = threading.Lock()


def _collective_keys(strategy: tf.distribute.Strategy) -> list:
    """The strategy's instance-key counters: its own and its cross-device ops' (a user's
    ``CollectiveAllReduce`` has its own), each once; none for a strategy without collectives."""
    extended = strategy.extended
    found = []
    for owner in (
        extended,
        getattr(extended, "_cross_device_ops", None),
        getattr(extended, "_collective_ops", None),
    ):
        keys = getattr(owner, "_collective_keys", None)
        if (
            hasattr(keys, "_instance_key_table")
            and hasattr(keys, "_lock")
            and all(keys is not k for k in found)
        ):
            found.append(keys)
    return found


def _counters(keys):
    """Every ``(group table, device)`` pair of one counter object."""
    return [(table, device) for table in keys._instance_key_table.values() for device in table]


def separate_collective_keys(strategy: tf.distribute.Strategy) -> None:
    """Set every instance-key counter of ``strategy`` to the largest counter of any strategy seen
    so far (this one included), so that the keys it draws next were drawn by no earlier strategy.

    The counters of one group stay equal to each other (the replicas of one all-reduce draw the
    same key), and a strategy seen again moves past the keys drawn since by the others."""
    mine = _collective_keys(strategy)
    if not mine:
        return
    with _LOCK:
        for keys in mine:
            if all(keys is not k for k in _SEEN):
                _SEEN.append(keys)
        floor = None
        for keys in _SEEN:
            with keys._lock:
                for table, device in _counters(keys):
                    floor = table[device] if floor is None else max(floor, table[device])
        # a group the strategy forms later gets a key that no strategy seen so far has used
        next_group = max(getattr(keys, "_group_key", 0) for keys in _SEEN)
        for keys in mine:
            with keys._lock:
                if floor is not None:
                    for table, device in _counters(keys):
                        table[device] = floor
                if hasattr(keys, "_group_key"):
                    keys._group_key = next_group
