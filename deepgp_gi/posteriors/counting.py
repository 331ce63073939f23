"""Counting variational parameters: :func:`parameter_count` and :func:`parameter_table`.

A model's variational parameters are its posterior's (every ``gpflow.Parameter`` or variable of
the :class:`~deepgp_gi.posteriors.DeepPosterior`, trainable or not, including a random-scale
prior's ``q(s)``) plus the inducing locations a layer carries for a local family
(``GPLayer.inducing_variable``, ``DenseLayer.inducing_features``). Prior hyperparameters,
kernels, mean functions and the likelihood are not counted.

Per-layer attribution: a posterior parameter whose path starts with a per-layer list
(``.weights[1]``, ``.inducing_weights[0].z_rows``, ``.u_means[2]``, ``.scale_posteriors[0]``,
``.pseudo_data[1]``, ...) belongs to that layer; a posterior class may map other attributes to a
layer with ``_LAYER_OF_ATTRIBUTE = {"attribute": layer_index}`` (negative indices count from the
end); everything else (global inducing inputs, a joint fully-coupled ``q``) is ``"shared"``. A
posterior that holds state besides its parameters (a sampler's momenta, window and samples) names
the attributes that count in ``_COUNTED_ATTRIBUTES``.
A posterior whose lists index only some of its layers (a convolutional network's weighted
layers) names them in ``_parameter_layers``; ``layer_j`` is then its ``j``-th weighted layer.
"""

from __future__ import annotations

import re
from typing import Dict, Mapping, Optional, Union

import gpflow
import numpy as np

from .base import DeepPosterior

__all__ = ["parameter_count", "parameter_table"]

_PATH = re.compile(r"^\.(?P<attr>\w+)(\[(?P<index>\d+)\])?")


def _posterior_of(model) -> DeepPosterior:
    posterior = getattr(model, "posterior", model)
    if not isinstance(posterior, DeepPosterior):
        raise TypeError(f"model must be a DeepGP or a DeepPosterior, got {type(model).__name__}")
    return posterior


def parameter_count(model, per_layer: bool = False) -> Union[int, Dict[str, int]]:
    """The number of scalar variational parameters of ``model`` (a DeepGP or a DeepPosterior).

    :param per_layer: if True, return ``{"layer_0": n_0, ..., "layer_{L-1}": n_{L-1}, "shared": n_s,
        "total": n}`` (the layer entries and ``"shared"`` sum to ``"total"``; for a convolutional
        network ``layer_j`` is the ``j``-th weighted layer); else the total.
    """
    posterior = _posterior_of(model)
    layers = list(getattr(posterior, "_parameter_layers", posterior.layers))
    L = len(layers)
    counts = {f"layer_{l}": 0 for l in range(L)}
    counts["shared"] = 0
    overrides = getattr(posterior, "_LAYER_OF_ATTRIBUTE", {})
    counted = getattr(posterior, "_COUNTED_ATTRIBUTES", None)
    for path, param in gpflow.utilities.parameter_dict(posterior).items():
        match = _PATH.match(path)
        if counted is not None and (match is None or match.group("attr") not in counted):
            continue
        size = int(np.prod(param.shape))
        layer: Optional[int] = None
        if match is not None:
            if match.group("index") is not None:
                layer = int(match.group("index"))
            elif match.group("attr") in overrides:
                layer = overrides[match.group("attr")] % L
        key = f"layer_{layer}" if layer is not None and 0 <= layer < L else "shared"
        counts[key] += size
    for l, layer in enumerate(layers):
        for attr in ("inducing_features", "inducing_variable", "inducing_images"):
            value = getattr(layer, attr, None)
            if isinstance(value, gpflow.Parameter):
                counts[f"layer_{l}"] += int(np.prod(value.shape))
            elif value is not None:
                counts[f"layer_{l}"] += sum(
                    int(np.prod(p.shape)) for p in gpflow.utilities.parameter_dict(value).values()
                )
    total = sum(counts.values())
    if not per_layer:
        return total
    counts["total"] = total
    return counts


def parameter_table(models: Mapping[str, object], reference: Optional[str] = None) -> str:
    """A Markdown table of :func:`parameter_count` per layer for named models (Ritter et al.
    Table 9 style), with each total as a percentage of ``reference``'s (a key of ``models``)."""
    rows = {name: parameter_count(m, per_layer=True) for name, m in models.items()}
    depth = max(sum(k.startswith("layer_") for k in r) for r in rows.values())
    header = ["posterior"] + [f"layer {l}" for l in range(depth)] + ["shared", "total"]
    if reference is not None:
        if reference not in rows:
            raise ValueError(f"reference {reference!r} is not one of the models {list(rows)}")
        header.append(f"% of {reference}")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, r in rows.items():
        cells = (
            [name]
            + [f"{r.get(f'layer_{l}', 0):,}" for l in range(depth)]
            + [f"{r['shared']:,}", f"{r['total']:,}"]
        )
        if reference is not None:
            cells.append(f"{100.0 * r['total'] / rows[reference]['total']:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
