"""The budget book on Redis: the store's server, under its prefix (default ``sw:``)::

    budgets                 HASH   team -> Budget JSON
    budget:history          LIST   JSON changes {team, action, who, at, before, after}
    budget:spent:{team}     HASH   window id (2026-12, 2026-W49, total) -> dollars charged
    budget:reserved         HASH   team -> dollars reserved, not yet spent or released
    budget:res              HASH   "<instance request id>|<team>" -> JSON [amount, left, at]
    budget:applied          SET    reservation tokens applied (a launch's request id, a start's
                                   "start:<job>:<attempt>"): a plan applied twice reserves once
    budget:alerts:{team}    HASH   "<window id>:<percent>" -> when it fired
    ledger:mark             HASH   instance request id -> last interval booked
    ledger:done             SET    instances settled (every interval booked, reservation freed)
    ledger:usd / ledger:gpu_s / ledger:idle_s
                            HASH   "team|site|day" -> dollars, GPU-seconds used, idle GPU-s

Reservations, charges and settlements are Lua scripts (broker/store/budgets_lua.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import redis

from broker.store.budgets_base import (
    HISTORY_CAP,
    Budget,
    BudgetBook,
    Part,
    Refusal,
    Reservation,
    dumps,
    window_ids,
)
from broker.store.budgets_lua import CHARGE, RESERVE, SETTLE


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class RedisBudgets(BudgetBook):
    def __init__(self, client: redis.Redis, prefix: str = "sw:") -> None:
        self.r, p = client, prefix
        self.p = p
        self.k_budgets, self.k_history = f"{p}budgets", f"{p}budget:history"
        self.k_reserved, self.k_res = f"{p}budget:reserved", f"{p}budget:res"
        self.k_applied = f"{p}budget:applied"
        self.k_mark, self.k_done = f"{p}ledger:mark", f"{p}ledger:done"
        self.k_usd, self.k_gpu, self.k_idle = f"{p}ledger:usd", f"{p}ledger:gpu_s", \
            f"{p}ledger:idle_s"
        self._reserve = client.register_script(RESERVE)
        self._charge = client.register_script(CHARGE)
        self._settle = client.register_script(SETTLE)

    def _k_spent(self, team: str) -> str:
        return f"{self.p}budget:spent:{team}"

    def _k_alerts(self, team: str) -> str:
        return f"{self.p}budget:alerts:{team}"

    # -- budgets -------------------------------------------------------------------------------

    def _put(self, budget: Budget | None, team: str, entry: dict[str, Any]) -> None:
        pipe = self.r.pipeline(transaction=True)
        if budget is None:
            pipe.hdel(self.k_budgets, team)
        else:
            pipe.hset(self.k_budgets, team, dumps(budget.to_dict()))
        pipe.rpush(self.k_history, dumps(entry))
        pipe.ltrim(self.k_history, -HISTORY_CAP, -1)
        pipe.execute()

    def budgets(self) -> dict[str, Budget]:
        return {_s(k): Budget.from_dict(json.loads(v))
                for k, v in self.r.hgetall(self.k_budgets).items()}

    def history(self, team: str | None = None) -> list[dict[str, Any]]:
        rows = [json.loads(x) for x in self.r.lrange(self.k_history, 0, -1)]
        return [h for h in rows if team is None or h["team"] == team]

    # -- money ---------------------------------------------------------------------------------

    def spent(self, team: str) -> dict[str, float]:
        return {_s(k): float(v) for k, v in self.r.hgetall(self._k_spent(team)).items()}

    def reserved(self) -> dict[str, float]:
        return {_s(k): float(v) for k, v in self.r.hgetall(self.k_reserved).items()}

    def queue_committed(self, pipe: Any) -> None:
        """Queue :meth:`committed`'s first read on ``pipe`` (a snapshot's MULTI: no round
        trip of its own); its two replies are :meth:`committed`'s ``read``."""
        pipe.hgetall(self.k_budgets)
        pipe.hgetall(self.k_reserved)

    def committed(self, now: float, read: tuple[Any, Any] | None = None
                  ) -> tuple[dict[str, Budget], dict[str, float]]:
        """``read``: the replies of :meth:`queue_committed`, if made (else read here). With no
        budget set, that is all it reads."""
        pipe = self.r.pipeline(transaction=False)
        if read is None:
            pipe.hgetall(self.k_budgets)
            pipe.hgetall(self.k_reserved)
            raw, reserved = pipe.execute()
        else:
            raw, reserved = read
        caps = {_s(k): Budget.from_dict(json.loads(v)) for k, v in raw.items()}
        if not caps:
            return caps, {}
        wids = window_ids(now)
        for team, b in caps.items():
            pipe.hget(self._k_spent(team), wids[b.window])
        spent = pipe.execute()
        res = {_s(k): float(v) for k, v in reserved.items()}
        return caps, {t: float(x or 0.0) + res.get(t, 0.0) for t, x in zip(caps, spent)}

    def reservations(self) -> list[Reservation]:
        out = []
        for k, v in self.r.hgetall(self.k_res).items():
            key, _, team = _s(k).rpartition("|")
            amount, left, at = json.loads(v)
            out.append(Reservation(key, team, float(amount), float(left), float(at)))
        return out

    def reserve(self, parts: Sequence[tuple[str, str, float]], now: float,
                token: str = "") -> Refusal | None:
        if not parts:
            return None
        need: dict[str, float] = {}
        for _, team, usd in parts:
            need[team] = need.get(team, 0.0) + usd
        w = window_ids(now)
        args: list[Any] = [repr(now), w["month"], w["week"], token or parts[0][0], len(need)]
        for team, usd in need.items():
            args += [team, repr(usd)]
        for key, team, usd in parts:
            args += [key, team, repr(usd)]
        keys = [self.k_budgets, self.k_reserved, self.k_res, self.k_applied,
                *(self._k_spent(t) for t in need)]
        got = [_s(x) for x in self._reserve(keys=keys, args=args)]
        if got[0] == "ok":
            return None
        return Refusal(got[1], float(got[2]), float(got[3]), float(got[4]), float(got[5]))

    def charge(self, key: str, interval: int, parts: Sequence[Part], now: float) -> bool:
        w = window_ids(now)
        args: list[Any] = [key, interval, w["month"], w["week"]]
        for p in parts:
            args += [p.team, repr(p.usd), repr(p.gpu_s), repr(p.idle_s),
                     f"{p.team}|{p.site}|{p.day}"]
        keys = [self.k_mark, self.k_done, self.k_reserved, self.k_res, self.k_usd, self.k_gpu,
                self.k_idle, *(self._k_spent(p.team) for p in parts)]
        return bool(self._charge(keys=keys, args=args))

    def settle(self, key: str) -> None:
        fields = [_s(f) for f, _ in self.r.hscan_iter(self.k_res, match=f"{key}|*")
                  if _s(f).rpartition("|")[0] == key]
        self._settle(keys=[self.k_reserved, self.k_res, self.k_done], args=[key, *fields])

    def settled(self) -> frozenset[str]:
        return frozenset(_s(k) for k in self.r.smembers(self.k_done))

    def charged_upto(self, key: str) -> int | None:
        pipe = self.r.pipeline(transaction=False)
        pipe.sismember(self.k_done, key)
        pipe.hget(self.k_mark, key)
        done, mark = pipe.execute()
        return -1 if done else None if mark is None else int(mark)

    def sums(self) -> dict[tuple[str, str, str], tuple[float, float, float]]:
        pipe = self.r.pipeline(transaction=False)
        for k in (self.k_usd, self.k_gpu, self.k_idle):
            pipe.hgetall(k)
        usd, gpu, idle = ({_s(k): float(v) for k, v in h.items()} for h in pipe.execute())
        out = {}
        for f, dollars in usd.items():
            team, site, day = f.split("|", 2)
            out[(team, site, day)] = (dollars, gpu.get(f, 0.0), idle.get(f, 0.0))
        return out

    def _fire(self, team: str, field_: str, now: float) -> bool:
        return bool(self.r.hsetnx(self._k_alerts(team), field_, repr(now)))

    def alerts(self, team: str) -> dict[str, float]:
        return {_s(k): float(v) for k, v in self.r.hgetall(self._k_alerts(team)).items()}
