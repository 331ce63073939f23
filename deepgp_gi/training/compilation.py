"""``fit(jit_compile="auto")``: XLA for a family only on the devices where its XLA step is faster.

Whether XLA's compiled step beats the plain ``tf.function`` step depends on the family and the
device (on a CPU, XLA's expanders for Cholesky factorisations and triangular solves compete with
TensorFlow's own kernels; on a GPU, fusion saves kernel launches), so the choice is a table, not
a rule: :data:`XLA_FASTER` lists the (posterior class, device kind) pairs that compile with XLA
and every other pair runs plain. A pair enters the set only from a benchmark
(``benchmarks/speed.py --only xla``; see ``docs/performance.md``).
"""

from __future__ import annotations

from typing import Optional, Union

import tensorflow as tf

__all__ = ["XLA_FASTER", "device_kind", "resolve_jit_compile"]

#: ``(posterior class name, device kind)`` pairs whose XLA step ``fit(jit_compile="auto")``
#: uses, e.g. ``("FactorisedWeightPosterior", "GPU")``; the device kind is :func:`device_kind`'s.
#: Empty: no family's XLA step is faster than its plain one on the devices benchmarked so far
#: (docs/performance.md).
XLA_FASTER: frozenset = frozenset()


def device_kind() -> str:
    """``"GPU"`` when TensorFlow sees a GPU (the step then runs there), else ``"CPU"``."""
    return "GPU" if tf.config.list_logical_devices("GPU") else "CPU"


def resolve_jit_compile(
    jit_compile: Union[bool, str],
    model,
    *,
    natgrad: bool = False,
    strategy: Optional[tf.distribute.Strategy] = None,
) -> bool:
    """``fit``'s ``jit_compile`` as a bool: ``True`` / ``False`` as given; ``"auto"`` is True
    exactly when ``(type(model.posterior).__name__, device_kind())`` is in :data:`XLA_FASTER` and
    the step is a plain one (a natural-gradient step or a ``tf.distribute`` strategy runs plain
    under ``"auto"``; ``True`` compiles them too).

    :raises TypeError: anything other than a bool or ``"auto"``.
    """
    if isinstance(jit_compile, bool):
        return jit_compile
    if not (isinstance(jit_compile, str) and jit_compile == "auto"):
        raise TypeError(f"jit_compile must be True, False or 'auto', got {jit_compile!r}")
    if natgrad or strategy is not None:
        return False
    return (type(model.posterior).__name__, device_kind()) in XLA_FASTER
