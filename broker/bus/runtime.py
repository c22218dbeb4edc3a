"""Per-process wiring: the config, the store and the Celery app, built once.

Each is imported when first used: a CLI command that only reads the store (``spillway
queue``) never imports Celery.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from broker.config.core import Config, load_config
from broker.errors import ConfigError
from broker.security.redact import install_log_redaction, url_password

if TYPE_CHECKING:
    import redis
    from celery import Celery

    from broker.bus.commands import Outbox
    from broker.store.base import BaseStore


@dataclass
class Runtime:
    config: Config
    redis_url: str
    # where the leading scheduler's node commands go (broker.bus.commands.Outbox): sent by a
    # thread of their own; None: sent at once, by the caller
    outbox: Outbox | None = None

    @cached_property
    def store(self) -> BaseStore:
        from broker.store import open_store

        return open_store(self.redis_url, self.config)

    @cached_property
    def redis(self) -> redis.Redis:
        import redis

        return redis.Redis.from_url(self.redis_url)

    @cached_property
    def celery(self) -> Celery:
        """The process's Celery app, aimed at this cluster. Commands are sent by name
        (broker.bus.commands), so no task module needs importing here."""
        from broker.bus.app import app as celery_app
        from broker.bus.app import configure

        return configure(celery_app, self.redis_url, self.config)


_lock = threading.Lock()
_current: Runtime | None = None


def init_runtime(redis_url: str | None = None, config: Config | None = None) -> Runtime:
    """Set this process's runtime (CLI entry points call this once)."""
    global _current
    config = config or load_config()
    url = redis_url or os.environ.get("SPILLWAY_REDIS_URL") or config.redis_url
    if not url:
        raise ConfigError(
            "no Redis URL: pass --redis-url, set SPILLWAY_REDIS_URL, or run `spillway up` "
            "for the embedded server"
        )
    # every log line of this process (scheduler, provisioner, tools) without secrets
    install_log_redaction(extra=[url_password(url), config.metrics_token,
                                 config.metrics_basic_auth])
    with _lock:
        _current = Runtime(config, url)
        _current.celery  # noqa: B018  (configure the app now)
    return _current


def runtime() -> Runtime:
    """This process's runtime, initialised from the environment on first use."""
    with _lock:
        current = _current
    return current if current is not None else init_runtime()
