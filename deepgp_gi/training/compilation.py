"""``fit(jit_compile="auto")``: XLA for a family only where it was measured faster on the device.

On a CPU an XLA-compiled step of these models is usually slower than the plain ``tf.function``
step (XLA's CPU expanders for Cholesky factorisations and triangular solves are slower than
TensorFlow's kernels, and the plain executor already overlaps independent ops); on a GPU, where a
step is bound by kernel launches, fusion may win, but that has to be measured per family too.
:data:`XLA_FASTER` lists the (posterior class, device kind) pairs whose XLA step was measured
faster than the plain one (``benchmarks/speed.py --only xla``; the table and the rule are in
``docs/performance.md``); every other pair runs plain. A pair enters the set only with a
measurement.
"""

from __future__ import annotations

from typing import Optional, Union

import tensorflow as tf

__all__ = ["XLA_FASTER", "device_kind", "resolve_jit_compile"]

#: ``(posterior class name, device kind)`` pairs where ``fit``'s XLA step was measured faster
#: than its plain step (benchmarks/results/speed.md, "Plain against XLA"; docs/performance.md).
#: Empty: on the 2-core CPU every family's XLA step was slower at depth 3, M = 100, batch 1000
#: (STAR 3.4x, global 3.3x, mean-field 2.8x, SGHMC 1.6x, the factorised BNN 1.2x), and the XLA
#: rows of the GPU table (benchmarks/results/gpu.md) are not measured yet.
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
    the step is a plain one (no natural-gradient step, no ``tf.distribute`` strategy: neither
    was measured under XLA; ``True`` compiles them too).

    :raises TypeError: anything other than a bool or ``"auto"``.
    """
    if isinstance(jit_compile, bool):
        return jit_compile
    if not (isinstance(jit_compile, str) and jit_compile == "auto"):
        raise TypeError(f"jit_compile must be True, False or 'auto', got {jit_compile!r}")
    if natgrad or strategy is not None:
        return False
    return (type(model.posterior).__name__, device_kind()) in XLA_FASTER
