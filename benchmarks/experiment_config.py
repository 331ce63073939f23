"""The UCI sweeps' configurations as their result lines store them.

A line stores its configuration in the canonical form of
:func:`deepgp_gi.uci_protocol.normalise_config`. Keys added to
:data:`~deepgp_gi.uci_protocol.CONFIG_KEYS` after a line was written read as :data:`LEGACY_VALUES`
in that line (:func:`with_legacy_values`), so that old lines keep matching the configuration they
ran (:func:`config_key`).
"""

from __future__ import annotations

from typing import Dict

from deepgp_gi import uci_protocol
from deepgp_gi.uci_protocol import GLOBAL_LAST_LAYER, OFFDIAGONAL_DEFAULTS

__all__ = ["LEGACY_VALUES", "with_legacy_values", "config_key"]

#: Values of keys added to ``CONFIG_KEYS`` later, for result lines written before them: every
#: earlier line used the random 90/10 splits, every earlier deep GP the softplus transform (the
#: library's only one then), every earlier STAR posterior the plain off-diagonal blocks (and the
#: fully-coupled lines written before the preconditioned default were trained with Lindinger's
#: plain storage), every earlier global-inducing last layer (deep GP or BNN) was sampled, and every
#: earlier line trained on its whole training split (``validation`` None: no rows held out) and
#: on the ELBO (``objective`` None).
#: :func:`config_key` reads a missing key as this value.
LEGACY_VALUES = {
    "protocol": "random",
    "positive_transform": "softplus",
    "offdiagonal": "plain",
    "last_layer": "sampled",
    "validation": None,
    "objective": None,
}


def with_legacy_values(record: Dict) -> Dict:
    """A copy of a result line (or configuration) with the keys added to ``CONFIG_KEYS`` after it
    was written filled in from :data:`LEGACY_VALUES` (``positive_transform`` only for deep GPs). A
    key stored as null counts as missing: fully-coupled lines written before it carried
    ``offdiagonal`` have ``null`` there and were trained with the plain storage."""
    out = dict(record)
    for k, v in LEGACY_VALUES.items():
        applies = {
            "positive_transform": out.get("model") == "gp",
            "offdiagonal": out.get("model") == "gp"
            and out.get("posterior") in OFFDIAGONAL_DEFAULTS,
            "last_layer": (out.get("model"), out.get("posterior")) in GLOBAL_LAST_LAYER,
        }.get(k, True)
        if out.get(k) is None and applies:
            out[k] = v
    return out


def config_key(cfg: Dict) -> str:
    """The canonical string of a configuration (:func:`deepgp_gi.uci_protocol.config_key`), a key
    the line predates read as in :func:`with_legacy_values`: two lines of one
    configuration match."""
    return uci_protocol.config_key(with_legacy_values(cfg))
