"""Reaching Redis: the services' start-up wait, the client's one error for an outage, and
a URL read from a credentials file (:func:`url_from_file`).

``spillway scheduler`` and ``spillway worker`` call :func:`wait_for_redis` before anything
else touches the store: one log line per attempt, and after ``redis_retry_s`` a
:class:`~broker.errors.StoreUnreachable` that the service reports in one line before it exits 1.
The client wraps its store and Redis handles in :func:`guarded`, so that an outage raises
:class:`~broker.errors.StoreUnreachable` (a ``ConnectionError``) naming the URL and what to do,
never a raw ``redis.exceptions.ConnectionError``.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis

from broker.errors import ConfigError, StoreRefused, StoreUnreachable

T = TypeVar("T")

#: What the Redis client raises when the server does not answer.
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError)
#: What it raises when the server answers but refuses this client (checked first: an
#: AuthenticationError is a ConnectionError).
REFUSED = (redis.AuthenticationError, redis.exceptions.NoPermissionError,
           redis.exceptions.AuthenticationWrongNumberOfArgsError)


def hide_password(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}"
    netloc += f":{parts.port}" if parts.port else ""
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def wait_for_redis(url: str, limit_s: float, stop: threading.Event, service: str,
                   log: logging.Logger) -> bool:
    """Ping Redis at ``url`` until it answers (True) or ``stop`` is set (False). After
    ``limit_s`` seconds without an answer (0 or less: never) raise StoreUnreachable, whose
    text says what to do."""
    shown = hide_password(url)
    client = redis.Redis.from_url(url, socket_connect_timeout=2.0, socket_timeout=2.0)
    start = time.monotonic()
    delay, attempt = 0.5, 0
    try:
        while not stop.is_set():
            attempt += 1
            try:
                client.ping()
                if attempt > 1:
                    log.warning("Redis at %s answers; the %s starts", shown, service)
                return True
            except REFUSED as e:  # a wrong password: waiting cannot fix it
                raise StoreRefused(shown, e) from None
            except UNREACHABLE as e:
                cause = str(e) or type(e).__name__
                waited = time.monotonic() - start
                left = limit_s - waited
                if limit_s > 0 and left <= 0:
                    raise StoreUnreachable(
                        shown, f"{cause}; no answer for {waited:.0f}s, redis_retry_s is "
                               f"{limit_s:g}") from None
                pause = min(delay, left) if limit_s > 0 else delay
                until = f", giving up in {left:.0f}s" if limit_s > 0 else ""
                log.warning("cannot reach Redis at %s (%s): attempt %d, retrying in %.1fs%s",
                            shown, cause, attempt, pause, until)
                stop.wait(pause)
                delay = min(delay * 2, 5.0)
        return False
    finally:
        client.close()


class _Guarded:
    """Calls ``target``'s methods, turning an unreachable Redis into StoreUnreachable."""

    def __init__(self, target: Any, url: str) -> None:
        self._target, self._url = target, url

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return value

        @functools.wraps(value)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                result = value(*args, **kwargs)
            except REFUSED as e:
                raise StoreRefused(hide_password(self._url), e) from None
            except UNREACHABLE as e:
                raise StoreUnreachable(hide_password(self._url), e) from e
            if isinstance(result, redis.client.Pipeline):  # its execute() talks to Redis
                return _Guarded(result, self._url)
            return result

        return call

    def __enter__(self) -> Any:
        return _Guarded(self._target.__enter__(), self._url)

    def __exit__(self, *exc: object) -> Any:
        return self._target.__exit__(*exc)


def guarded(target: T, url: str) -> T:
    """``target`` (a store or a Redis client) whose calls raise StoreUnreachable instead of
    the Redis client's connection errors."""
    return _Guarded(target, url)  # type: ignore[return-value]


def url_from_file(path: str, what: str = "SPILLWAY_REDIS_URL_FILE") -> str:
    """The URL in the file ``path`` (its first line; "" for no path). A credential file
    belongs to its reader alone: ConfigError if it cannot be read or others may read it."""
    if not path:
        return ""
    try:
        st = os.stat(path)
        with open(path) as f:
            url = f.readline().strip()
    except OSError as e:
        raise ConfigError(f"{what}={path}: cannot read it ({e.strerror})") from None
    if st.st_mode & 0o077:
        raise ConfigError(f"{what}={path}: mode {st.st_mode & 0o777:o} lets other users read "
                          f"the credentials in it; chmod 600 {path}")
    if not url:
        raise ConfigError(f"{what}={path}: the file is empty; it should hold one Redis URL")
    return url
