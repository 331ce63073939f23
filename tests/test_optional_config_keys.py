"""The UCI protocol's optional positive-number keys (``collect_step_size``, ``noise_floor``,
``noise_start``): stored as floats, refused by name when impossible, and a result line written
before the key (so without it) still names the same configuration."""

import numpy as np
import pytest

from deepgp_gi import uci_protocol

#: Each key with a value it accepts.
OPTIONAL_FLOAT_KEYS = {"collect_step_size": 3e-2, "noise_floor": 1 / 12, "noise_start": 1}
BASE = dict(dataset="energy", posterior="sghmc", depth=2)


@pytest.mark.parametrize(("key", "value"), OPTIONAL_FLOAT_KEYS.items())
def test_an_optional_key_is_stored_as_a_float_and_a_line_without_it_keeps_its_config(key, value):
    cfg = uci_protocol.normalise_config(dict(BASE, **{key: value}))
    assert cfg[key] == pytest.approx(float(value)) and isinstance(cfg[key], float)
    plain = uci_protocol.normalise_config(BASE)
    assert plain[key] is None
    old = {k: v for k, v in plain.items() if k != key}
    assert uci_protocol.config_key(old) == uci_protocol.config_key(plain)
    assert uci_protocol.config_key(cfg) != uci_protocol.config_key(plain)


@pytest.mark.parametrize("key", OPTIONAL_FLOAT_KEYS)
@pytest.mark.parametrize("value", [0.0, -0.1, np.inf, np.nan, True, False, "0.1"])
def test_an_impossible_value_is_refused_by_name(key, value):
    with pytest.raises(ValueError, match=f"{key} must be a positive finite number"):
        uci_protocol.normalise_config(dict(BASE, **{key: value}))
