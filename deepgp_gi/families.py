"""The family tables by model kind, for the builders, ``DeepGP`` and the command line.

The tables themselves (``name -> posterior class``) and :func:`register` live in
:mod:`deepgp_gi.posteriors.registry`; this module names them where a model is assembled:
:func:`posterior_class` picks the table from the layers (DenseLayers: a BNN) and
:func:`check_options` refuses options a family does not take.
"""

from __future__ import annotations

from typing import Dict, Tuple

from .posteriors.registry import BNN_FAMILIES, CONV_BNN_FAMILIES, DEEP_GP_FAMILIES, register
from .posteriors.weight_space import has_feature_map

__all__ = [
    "DEEP_GP_FAMILIES",
    "BNN_FAMILIES",
    "CONV_BNN_FAMILIES",
    "register",
    "posterior_class",
    "check_options",
]


def _table_for(layers) -> Tuple[str, Dict[str, type]]:
    if layers and all(has_feature_map(layer) for layer in layers):
        return "BNN", BNN_FAMILIES
    return "deep GP", DEEP_GP_FAMILIES


def posterior_class(name: str, layers) -> type:
    """The posterior class that ``DeepGP(layers, ..., posterior=name)`` builds for these layers."""
    kind, table = _table_for(layers)
    if not isinstance(name, str) or name not in table:
        raise ValueError(
            f"unknown posterior {name!r} for {kind} layers; choose one of "
            f"{', '.join(map(repr, table))}"
        )
    return table[name]


def check_options(name: str, cls: type, options: dict) -> None:
    """Refuse ``options`` family ``name`` (class ``cls``) does not take, naming the ones it
    accepts."""
    cls.check_options(options, name)
