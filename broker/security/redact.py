"""Keeping secrets out of what Spillway prints, logs and hands to jobs.

* :func:`redact_url`: a URL with its password replaced by ``***`` (``redis://:***@host``).
* :func:`scrub`: a text with every known secret and every URL password in it replaced.
* :func:`secret_values`: the secrets of an environment (the password of ``SPILLWAY_REDIS_URL``,
  tokens, cloud keys), for :func:`scrub`.
* :func:`job_base_env`: an agent's environment without its secrets, the base of every job's
  environment (a job gets what its spec's ``env`` sets, never the agent's credentials).
* :func:`masked`: JSON-like output (``--json``) with a spec's secret-named ``env`` values
  and URL passwords masked; :func:`masked_env` for one ``env`` shown as text.
* :func:`install_log_redaction`: a filter on every root handler that scrubs each record.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

MASK = "***"

#: Variables whose value is a secret as a whole: a word of the upper-cased name (so
#: ``HF_TOKEN`` and ``AWS_SECRET_ACCESS_KEY`` are, ``TOKENIZERS_PARALLELISM`` is not).
_SECRET_NAME = re.compile(r"(^|_)(PASSWORD|PASSWD|PASS|SECRET|TOKEN|CREDENTIALS?|PRIVATE_KEY|"
                          r"API_KEY|ACCESS_KEY|BASIC_AUTH|SESSION_KEY)(_|$)")
#: Variables that are a Redis URL (their password is the secret; the job needs none of them).
_URL_VARS = ("SPILLWAY_REDIS_URL", "REDIS_URL", "CELERY_BROKER_URL", "SPILLWAY_REDIS_URL_FILE")
#: user:password@ inside any URL, e.g. redis://agent-n1:s3cret@host:6379/0.
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*:)(?P<pw>[^@\s/]+)@")
_MIN_SECRET = 8  # shorter values are not scrubbed from texts (they would mangle them: "true")


def redact_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``; anything unparsable is
    scrubbed by pattern instead."""
    try:
        parts = urlsplit(url)
        password = parts.password
        port = parts.port
    except ValueError:
        return _URL_PASSWORD.sub(lambda m: m["head"] + MASK + "@", url)
    if password is None:
        return url
    netloc = f"{parts.username or ''}:{MASK}@{parts.hostname or ''}"
    netloc += f":{port}" if port else ""
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def url_password(url: str) -> str | None:
    try:
        password = urlsplit(url).password
    except ValueError:
        return None
    return None if password is None else unquote(password)


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name.upper()))


def secret_values(env: Mapping[str, str] | None = None,
                  extra: Iterable[str | None] = ()) -> set[str]:
    """The secrets in ``env`` (default: this process's environment): values of variables
    named like a secret, and the password of every URL among the values; plus ``extra``."""
    env = os.environ if env is None else env
    found: set[str] = set()
    for name, value in env.items():
        if not value:
            continue
        if is_secret_name(name):
            found.add(value)
        if "://" in value:
            password = url_password(value)
            if password:
                found.add(password)
    found.update(s for s in extra if s)
    return {s for s in found if len(s) >= _MIN_SECRET}


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with URL passwords and each of ``secrets`` replaced by ``***``."""
    text = _URL_PASSWORD.sub(lambda m: m["head"] + MASK + "@", text)
    for secret in sorted(set(secrets), key=len, reverse=True):  # longest first
        if len(secret) >= _MIN_SECRET and secret in text:
            text = text.replace(secret, MASK)
    return text


def job_base_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The agent's environment without its secrets: no variable named like a secret, no
    Redis URL, no value holding a URL with a password. A job's spec may set its own."""
    env = os.environ if env is None else env
    return {k: v for k, v in env.items()
            if not is_secret_name(k) and k not in _URL_VARS
            and not _URL_PASSWORD.search(v)}


def masked_env(env: Mapping[str, str]) -> dict[str, str]:
    """A job spec's ``env`` for display: values of secret-named variables as ``***``, URL
    passwords masked (the job itself gets the real values)."""
    return {k: MASK if is_secret_name(k) else scrub(v) for k, v in env.items()}


def masked(value: Any) -> Any:
    """``value`` (JSON-like data: a job record, a list of them) with every ``env`` mapping
    masked (:func:`masked_env`) and URL passwords scrubbed from every string."""
    if isinstance(value, Mapping):
        return {k: masked_env(v) if k == "env" and isinstance(v, Mapping) and all(
                    isinstance(x, str) for x in v.values()) else masked(v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [masked(v) for v in value]
    if isinstance(value, str) and "://" in value:
        return scrub(value)
    return value


class SecretFilter(logging.Filter):
    """Scrubs each record's message (and its formatted traceback) before a handler writes
    it. ``secrets`` is read when the filter is made (the process's environment, plus any
    given); URL passwords are always scrubbed."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets = set(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: leave it to the handler's own reporting
            return True
        clean = scrub(message, self.secrets)
        if clean != message or record.args:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text, self.secrets)
        return True


def install_log_redaction(extra: Iterable[str | None] = (),
                          logger: logging.Logger | None = None) -> SecretFilter:
    """Put one :class:`SecretFilter` (this process's secrets plus ``extra``) on every handler
    of ``logger`` (default: the root logger); calling it again refreshes the secrets."""
    logger = logger or logging.getLogger()
    secrets = secret_values(extra=extra)
    found: SecretFilter | None = None
    for handler in logger.handlers:
        mine = next((f for f in handler.filters if isinstance(f, SecretFilter)), None)
        if mine is None:
            mine = found or SecretFilter(secrets)
            handler.addFilter(mine)
        mine.secrets |= secrets
        found = mine
    return found or SecretFilter(secrets)
