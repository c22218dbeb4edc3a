"""The one check of a mapping's keys against those allowed, as every configuration section
(and a simulator cluster file) words it: :func:`check_keys` ("unknown keys [...]; allowed:
...") and :func:`key_hint` (the closest allowed key, else all of them).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from broker.errors import ConfigError

__all__ = ["check_keys", "key_hint"]


def check_keys(raw: Iterable[Any], allowed: Sequence[str], where: str,
               error: type[Exception] = ConfigError) -> None:
    """``error`` naming every key of ``raw`` (a mapping, or its keys) that is not in
    ``allowed``, sorted, and listing the allowed ones in their order; nothing when all are."""
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        raise error(f"{where}: unknown keys {unknown}; allowed: {', '.join(allowed)}")


def key_hint(key: str, known: Sequence[str], spell: Callable[[str], str] = str) -> str:
    """What to say of ``key``, which is not one of ``known``: the closest known key (as
    ``spell`` writes it) when one is close, else every known key."""
    close = difflib.get_close_matches(key, known, n=1)
    return f"did you mean {spell(close[0])}?" if close else f"allowed: {', '.join(known)}"
