"""The store: one interface (:class:`BaseStore`), two backends (Redis and memory)."""

from __future__ import annotations

from broker.config import Config
from broker.errors import ConfigError
from broker.security.redact import redact_url
from broker.store.backend import LogLine
from broker.store.base import BaseStore
from broker.store.memory import MemoryStore
from broker.store.redis import RedisStore

__all__ = ["BaseStore", "LogLine", "MemoryStore", "RedisStore", "open_store"]

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def open_store(url: str | None, config: Config | None = None, prefix: str = "sw:") -> BaseStore:
    """``None`` or ``memory://``: a fresh in-memory store; a Redis URL: a RedisStore."""
    if url is None or url == "memory://":
        return MemoryStore(config)
    if url.startswith(_REDIS_SCHEMES):
        return RedisStore(url, config, prefix=prefix)
    raise ConfigError(
        f"store URL {redact_url(url)!r} is not supported; use memory:// or redis://host:port/db "
        "(rediss:// and unix:// work too)"
    )
