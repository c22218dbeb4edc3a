"""broker/config/keys.py: the one wording of an unknown key, for every configuration section."""

from __future__ import annotations

import pytest

from broker.config.keys import check_keys, key_hint
from broker.errors import ConfigError


def test_known_keys_pass_and_unknown_ones_are_named_sorted_with_the_allowed_in_order() -> None:
    check_keys({"name": 1, "rank": 2}, ("rank", "name"), "config classes[0]")
    with pytest.raises(ConfigError) as e:
        check_keys({"zeta": 1, "name": 2, 3: 4}, ("rank", "name"), "config classes[0]")
    assert str(e.value) == "config classes[0]: unknown keys ['3', 'zeta']; allowed: rank, name"


def test_the_error_class_is_the_caller_s() -> None:
    with pytest.raises(ValueError, match=r"^at: unknown keys \['x'\]; allowed: a$"):
        check_keys(["x"], ("a",), "at", error=ValueError)


def test_the_hint_names_the_closest_key_as_spelt_else_every_key() -> None:
    assert key_hint("grace", ("grace_s", "cycle_s")) == "did you mean grace_s?"
    assert key_hint("grace", ("grace_s",), lambda k: k.upper()) == "did you mean GRACE_S?"
    assert key_hint("zzz", ("grace_s", "cycle_s")) == "allowed: grace_s, cycle_s"
