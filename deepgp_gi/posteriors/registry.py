"""The name tables: one ``name -> posterior class`` map per model kind, and :func:`register`.

Every place that lists family names reads these tables: ``DeepGP(layers, lik, posterior=name)``,
:func:`~deepgp_gi.build_deep_gp` (:data:`DEEP_GP_FAMILIES`), :func:`~deepgp_gi.build_bnn`
(:data:`BNN_FAMILIES`), :func:`~deepgp_gi.build_conv_bnn` (:data:`CONV_BNN_FAMILIES`) and the
``deepgp-gi`` command. What a family is (options, initialisation from data, latent draw) is its
class's (:class:`~deepgp_gi.posteriors.DeepPosterior`); a table only names it.

A family defined outside the package joins a table with :func:`register`::

    class TemperedMeanField(dg.posteriors.MeanFieldPosterior):
        ...

    dg.posteriors.register("tempered_mean_field", TemperedMeanField)
    model = dg.build_deep_gp(X, Y, depth=2, posterior="tempered_mean_field")

The global and local inducing families are one posterior for deep GPs and BNNs alike; the BNN
tables hold their BNN subclasses, which carry the BNN options and initialisation.
"""

from __future__ import annotations

from typing import Dict, Iterable, Optional, Tuple, Union

from . import (
    bsgp,
    convolutional,
    dspp,
    factorised,
    inducing,
    inducing_weights,
    mean_field,
    sghmc,
    stripes_arrow,
    structured,
)
from .base import DeepPosterior

__all__ = [
    "DEEP_GP_FAMILIES",
    "BNN_FAMILIES",
    "CONV_BNN_FAMILIES",
    "MODEL_KINDS",
    "register",
    "family_class",
    "family_name",
]

#: Deep-GP families (``build_deep_gp(posterior=...)``, ``DeepGP(gp_layers, ..., posterior=...)``).
DEEP_GP_FAMILIES: Dict[str, type] = {
    "mean_field": mean_field.MeanFieldPosterior,
    "fully_coupled": structured.FullyCoupledPosterior,
    "stripes_arrow": stripes_arrow.StripesArrowPosterior,
    "global": inducing.GlobalInducingPosterior,
    "local": inducing.LocalInducingPosterior,
    "sghmc": sghmc.SGHMCPosterior,
    "bsgp": bsgp.BSGPPosterior,
    "dspp": dspp.DSPPPosterior,
}

#: The inducing-weight families (Ritter et al. 2021) and their weight-space baseline, in the dense
#: and the convolutional BNN tables alike (matrix-normal inducing weights on every weighted layer).
_INDUCING_WEIGHT_FAMILIES = {
    "ffg_u": inducing_weights.FFGInducingPosterior,
    "ensemble_u": inducing_weights.EnsembleInducingPosterior,
    "ensemble_w": inducing_weights.EnsembleWeightPosterior,
}

#: BNN families (``build_bnn(posterior=...)``, ``DeepGP(dense_layers, ..., posterior=...)``).
BNN_FAMILIES: Dict[str, type] = {
    "factorised": factorised.FactorisedWeightPosterior,
    "local": inducing.LocalInducingBNNPosterior,
    "global": inducing.GlobalInducingBNNPosterior,
    "factorised_global": factorised.FactorisedGlobalPosterior,
    "random_global": factorised.RandomGlobalPosterior,
    **_INDUCING_WEIGHT_FAMILIES,
}

#: Convolutional BNN families (``build_conv_bnn(posterior=...)``).
CONV_BNN_FAMILIES: Dict[str, type] = {
    "factorised": convolutional.FactorisedConvPosterior,
    "local": convolutional.LocalConvPosterior,
    "global": convolutional.GlobalConvPosterior,
    "factorised_global": convolutional.FactorisedGlobalConvPosterior,
    **_INDUCING_WEIGHT_FAMILIES,
}

#: Model kind -> its table.
MODEL_KINDS: Dict[str, Dict[str, type]] = {
    "deep_gp": DEEP_GP_FAMILIES,
    "bnn": BNN_FAMILIES,
    "conv_bnn": CONV_BNN_FAMILIES,
}


def _kinds_of_ancestors(cls: type) -> Tuple[str, ...]:
    """The model kinds whose table holds ``cls`` or a class it derives from."""
    return tuple(
        kind
        for kind, table in MODEL_KINDS.items()
        if any(issubclass(cls, member) for member in table.values())
    )


def register(
    name: str, cls: type, kinds: Union[None, str, Iterable[str]] = None, *, replace: bool = False
) -> type:
    """Add the posterior class ``cls`` to the tables of ``kinds`` under ``name``, so that the
    builders (``build_deep_gp(..., posterior=name)``, ``build_bnn``, ``build_conv_bnn``) and
    ``DeepGP(layers, ..., posterior=name)`` build it.

    :param name: the family's name (a non-empty string).
    :param cls: a subclass of :class:`~deepgp_gi.posteriors.DeepPosterior`; the builders call
        its ``from_data`` and read its ``options`` (:mod:`~deepgp_gi.posteriors.base`).
    :param kinds: ``"deep_gp"``, ``"bnn"``, ``"conv_bnn"`` or several; default: the kinds whose
        table holds a class ``cls`` derives from (a subclass of a deep-GP family is a deep-GP
        family).
    :param replace: allow ``name`` to replace a family already in a table.
    :return: ``cls``.
    :raises ValueError: for an empty name, an unknown kind, no kind to infer, or a name taken.
    :raises TypeError: if ``cls`` is not a :class:`~deepgp_gi.posteriors.DeepPosterior` subclass.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    if not (isinstance(cls, type) and issubclass(cls, DeepPosterior)):
        raise TypeError(
            f"cls must be a subclass of deepgp_gi.posteriors.DeepPosterior, got {cls!r}"
        )
    if kinds is None:
        kinds = _kinds_of_ancestors(cls)
        if not kinds:
            raise ValueError(
                f"{cls.__name__} derives from no registered family; give kinds= (one or more of "
                f"{', '.join(map(repr, MODEL_KINDS))})"
            )
    elif isinstance(kinds, str):
        kinds = (kinds,)
    kinds = tuple(kinds)
    for kind in kinds:
        if kind not in MODEL_KINDS:
            raise ValueError(
                f"unknown model kind {kind!r}; choose one of {', '.join(map(repr, MODEL_KINDS))}"
            )
        taken = MODEL_KINDS[kind].get(name)
        if taken is not None and taken is not cls and not replace:
            raise ValueError(
                f"the {kind} family {name!r} is already {taken.__name__}; pass replace=True to "
                "replace it"
            )
    for kind in kinds:
        MODEL_KINDS[kind][name] = cls
    return cls


def family_class(name: str, kind: str) -> type:
    """The posterior class of family ``name`` in the table of ``kind``; an unknown name raises a
    ``ValueError`` naming the table's families."""
    table = MODEL_KINDS[kind]
    if not isinstance(name, str) or name not in table:
        raise ValueError(f"unknown posterior {name!r}; choose one of {', '.join(map(repr, table))}")
    return table[name]


def family_name(posterior: Union[DeepPosterior, type], kind: Optional[str] = None) -> str:
    """The name under which ``posterior`` (an instance or a class) is registered: in the table of
    ``kind``, or the first table that holds its exact class."""
    cls = posterior if isinstance(posterior, type) else type(posterior)
    kinds = (kind,) if kind is not None else tuple(MODEL_KINDS)
    for k in kinds:
        for name, member in MODEL_KINDS[k].items():
            if member is cls:
                return name
    raise ValueError(
        f"{cls.__name__} is not a registered family"
        + (f" of kind {kind!r}" if kind is not None else "")
    )
