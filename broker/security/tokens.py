"""API tokens: one per person, bound to a role and to teams, stored hashed, with an expiry.

A token reads ``swt_<id>_<secret>``: ``id`` (12 hex digits) names its record, ``secret`` is 32
random bytes (URL-safe base64). The store keeps only the SHA-256 of the whole token, compared in
constant time, so a copy of Redis gives no one a usable token. Records live in one Redis hash
(``<prefix>tokens``: id -> JSON), and each token's submit budget in a token bucket
(``<prefix>ratelimit:<id>``) refilled by a Lua script, so every API server shares it.

Roles (docs/api.md has the table):

* ``user``: submit, see and cancel the jobs of its team;
* ``finance``: budgets and reports of the teams it is given;
* ``operator``: nodes, drain and resume, every job;
* ``admin``: tokens (and everything an operator may do).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from dataclasses import asdict, dataclass, replace
from typing import Any

import redis

from broker.errors import FieldError, SpecError, SpillwayError
from broker.model.classes import ROLES

_TOKEN_RE = re.compile(r"swt_([0-9a-f]{12})_([A-Za-z0-9_-]{20,100})")
_TEAM_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_USER_RE = re.compile(r"[A-Za-z0-9_.@+-]{1,128}")

_BUCKET = """
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local now, cost = tonumber(ARGV[3]), tonumber(ARGV[4])
local v = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(v[1]) or burst
local at = tonumber(v[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local wait = 0
if tokens >= cost then tokens = tokens - cost else wait = (cost - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return tostring(wait)
"""


class TokenError(SpillwayError):
    """A token was refused: missing, malformed, unknown, expired or revoked (HTTP 401)."""


class Refused(SpillwayError):
    """The token is valid but its role or team may not do this (HTTP 403). The message says
    which role or team would be needed."""


class RateLimited(SpillwayError):
    """Too many submits for one token (HTTP 429); ``retry_after`` seconds until it may."""

    def __init__(self, message: str, retry_after: float) -> None:
        self.retry_after = retry_after
        super().__init__(message)


@dataclass(frozen=True)
class TokenRecord:
    """What the store keeps about one token (never the token itself)."""

    id: str
    user: str
    role: str
    teams: tuple[str, ...]  # a user's one team; the teams a finance token may read
    created_at: float
    created_by: str
    expires_at: float | None  # None: never
    revoked_at: float | None = None
    revoked_by: str = ""
    digest: str = ""  # sha256 of the token, hex

    @property
    def team(self) -> str:
        return self.teams[0] if self.teams else ""

    @property
    def actor(self) -> str:
        """Who acts, as the job history records it: ``alice (user, team vision)``."""
        teams = f", team {','.join(self.teams)}" if self.teams else ""
        return f"{self.user} ({self.role}{teams})"

    def status(self, now: float) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"

    def to_dict(self, now: float | None = None) -> dict[str, Any]:
        """The record for people and JSON output: everything but the digest."""
        out = {k: v for k, v in asdict(self).items() if k != "digest"}
        out["teams"] = list(self.teams)
        if now is not None:
            out["status"] = self.status(now)
        return out

    @classmethod
    def from_json(cls, raw: bytes | str) -> TokenRecord:
        d = json.loads(raw)
        d["teams"] = tuple(d["teams"])
        return cls(**d)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_grant(user: str, role: str, teams: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The teams of a new token, or SpecError naming each bad field."""
    problems = []
    if not _USER_RE.fullmatch(user or ""):
        problems.append(FieldError("user", f"{user!r} is not a user name",
                                   "1-128 letters, digits and _.@+-"))
    if role not in ROLES:
        problems.append(FieldError("role", f"unknown role {role!r}", ", ".join(ROLES)))
    clean = tuple(dict.fromkeys(t.strip() for item in teams for t in item.split(",")
                                if t.strip()))
    bad = [t for t in clean if not _TEAM_RE.fullmatch(t)]
    if bad:
        problems.append(FieldError("team", f"{bad[0]!r} is not a team name",
                                   "1-64 letters, digits and _.-"))
    elif role in ("user", "finance") and not clean:
        problems.append(FieldError("team", f"a {role} token needs a team",
                                   "--team NAME (finance: repeatable)"))
    elif role == "user" and len(clean) > 1:
        problems.append(FieldError("team", "a user token belongs to exactly one team",
                                   "one --team (finance tokens may have several)"))
    if problems:
        raise SpecError(problems)
    return clean


class TokenStore:
    """Tokens and their submit buckets in Redis, under ``prefix`` (the store's)."""

    def __init__(self, client: redis.Redis, prefix: str = "sw:") -> None:
        self.redis = client
        self.key = f"{prefix}tokens"
        self._bucket_prefix = f"{prefix}ratelimit:"
        self._bucket = client.register_script(_BUCKET)

    def create(self, user: str, role: str, teams: list[str] | tuple[str, ...], now: float,
               expires_s: float | None = None, by: str = "") -> tuple[str, TokenRecord]:
        """A new token and its record; the token is returned once and never stored."""
        clean = check_grant(user, role, teams)
        if expires_s is not None and expires_s <= 0:
            raise SpecError([FieldError("expires", f"must be positive, got {expires_s:g}s",
                                        "a duration like 12h, 30d")])
        token_id = secrets.token_hex(6)
        token = f"swt_{token_id}_{secrets.token_urlsafe(32)}"
        rec = TokenRecord(token_id, user, role, clean, now, by or "?",
                          None if expires_s is None else now + expires_s, digest=digest(token))
        if not self.redis.hsetnx(self.key, token_id, json.dumps(asdict(rec))):
            return self.create(user, role, teams, now, expires_s, by)  # (an id collision)
        return token, rec

    def verify(self, token: str, now: float) -> TokenRecord:
        """The record of a valid token; TokenError (never saying which part was wrong
        beyond expired or revoked) otherwise."""
        m = _TOKEN_RE.fullmatch(token.strip())
        raw = self.redis.hget(self.key, m.group(1)) if m else None
        rec = TokenRecord.from_json(raw) if raw else None
        if rec is None or not hmac.compare_digest(rec.digest, digest(token.strip())):
            raise TokenError("invalid token: it is not one this server issued; ask an admin "
                             "for one (`spillway token create`)")
        if rec.revoked_at is not None:
            raise TokenError(f"token {rec.id} was revoked; ask an admin for a new one")
        if rec.expires_at is not None and rec.expires_at <= now:
            raise TokenError(f"token {rec.id} expired; ask an admin for a new one "
                             "(`spillway token create ... --expires 30d`)")
        return rec

    def list(self) -> list[TokenRecord]:
        """Every record, oldest first."""
        recs = [TokenRecord.from_json(v) for v in self.redis.hgetall(self.key).values()]
        return sorted(recs, key=lambda r: (r.created_at, r.id))

    def revoke(self, token_or_id: str, now: float, by: str = "") -> TokenRecord:
        """Revoke by id (or by the token itself); SpecError if there is no such token.
        Revoking twice keeps the first revocation."""
        m = _TOKEN_RE.fullmatch(token_or_id.strip())
        token_id = m.group(1) if m else token_or_id.strip()
        raw = self.redis.hget(self.key, token_id) if re.fullmatch(r"[0-9a-f]{12}",
                                                                   token_id) else None
        if raw is None:
            raise SpecError([FieldError("token", f"no token with id {token_or_id!r}",
                                        "an id from `spillway token list`")])
        rec = TokenRecord.from_json(raw)
        if rec.revoked_at is None:
            rec = replace(rec, revoked_at=now, revoked_by=by or "?")
            self.redis.hset(self.key, token_id, json.dumps(asdict(rec)))
        return rec

    def take(self, rec: TokenRecord, cost: int, now: float, rate: float, burst: int) -> None:
        """Take ``cost`` submits from the token's bucket (``rate`` a second, at most
        ``burst`` at once); RateLimited if there are not enough."""
        if cost > burst:
            raise RateLimited(f"rate limit: a batch of {cost} jobs is more than the {burst} a "
                              f"token may submit at once; split it", 0.0)
        wait = float(self._bucket(keys=[self._bucket_prefix + rec.id],
                                  args=[rate, burst, now, cost]))
        if wait > 0:
            raise RateLimited(
                f"rate limit: token {rec.id} ({rec.user}) may submit {rate:g} jobs a second "
                f"(bursts of {burst}); retry in {wait:.1f}s", wait)
