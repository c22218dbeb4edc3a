"""The store: one interface (:class:`BaseStore`), two backends (Redis and memory).

The names are imported when first asked for (``from broker.store import RedisStore``), so
that importing one of the package's modules (``broker.store.backend``) does not load both
backends and every rule: a command that reads jobs loads the Redis backend only
(tests/unit/test_cli_imports.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.config.core import Config
    from broker.store.backend import LogLine
    from broker.store.base import BaseStore
    from broker.store.memory import MemoryStore
    from broker.store.redis import RedisStore

__all__ = ["BaseStore", "LogLine", "MemoryStore", "RedisStore", "open_store"]

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")

def open_store(url: str | None, config: Config | None = None, prefix: str = "sw:") -> BaseStore:
    """``None`` or ``memory://``: a fresh in-memory store; a Redis URL: a RedisStore."""
    if url is None or url == "memory://":
        from broker.store.memory import MemoryStore

        return MemoryStore(config)
    if url.startswith(_REDIS_SCHEMES):
        from broker.store.redis import RedisStore

        return RedisStore(url, config, prefix=prefix)
    from broker.errors import ConfigError
    from broker.security.redact import redact_url

    raise ConfigError(
        f"store URL {redact_url(url)!r} is not supported; use memory:// or redis://host:port/db "
        "(rediss:// and unix:// work too)"
    )


def __getattr__(name: str) -> Any:
    value: Any
    if name == "BaseStore":
        from broker.store.base import BaseStore as value
    elif name == "LogLine":
        from broker.store.backend import LogLine as value
    elif name == "MemoryStore":
        from broker.store.memory import MemoryStore as value
    elif name == "RedisStore":
        from broker.store.redis import RedisStore as value
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value
