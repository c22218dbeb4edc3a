"""The Redis store's connection: its client, key prefix and keys, its Lua scripts (run by
their SHA, several in one round trip) and the writes gathered into one transaction.
:class:`RedisBase` is what the parts of :class:`broker.store.redis.RedisStore` share
(:mod:`broker.store.redis_logs`, :mod:`broker.store.redis_records`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import redis
from redis.exceptions import NoScriptError

from broker.config.core import Config
from broker.model import Node
from broker.store.base import BaseStore
from broker.store.lua import (
    ACK_NODE,
    ACQUIRE,
    ADD_USAGE,
    APPEND_LOGS,
    COMMIT,
    FORGET_NODE,
    INSTANCE_CAS,
    MARK_DOWN,
    PUT_NODE,
    RELEASE,
    RENEW,
)
from broker.store.redis_keys import HELLO, NodeKeys


class RedisBase(BaseStore):
    """The connection, keys and scripts of a Redis store (abstract: see
    :class:`~broker.store.redis.RedisStore`)."""

    def __init__(self, client: redis.Redis, config: Config | None, prefix: str) -> None:
        super().__init__(config)
        self._parsed_nodes: dict[str, tuple[bytes | str, Node]] = {}
        self._gather = threading.local()  # .pipe: apply()'s last writes, sent together
        self.redis = client
        self.prefix = prefix
        self._commit_script = self.redis.register_script(COMMIT)
        self._put_node_script = self.redis.register_script(PUT_NODE)
        self._mark_down_script = self.redis.register_script(MARK_DOWN)
        self._append_script = self.redis.register_script(APPEND_LOGS)
        p = prefix
        self._k_all, self._k_pending, self._k_active = (
            f"{p}jobs:all", f"{p}jobs:pending", f"{p}jobs:active")
        self._k_nodes, self._k_node_seq, self._k_reasons = (
            f"{p}nodes", f"{p}nodes:seq", f"{p}reasons")
        self._k_ver_pending, self._k_ver_active = f"{p}ver:pending", f"{p}ver:active"
        self._k_usage, self._k_runtimes, self._k_reservation = (
            f"{p}usage", f"{p}runtimes", f"{p}reservation")
        self._usage_script = self.redis.register_script(ADD_USAGE)
        self._k_order, self._k_failures = f"{p}order", f"{p}cycle:failures"
        self._k_archive = f"{p}archive"
        self._k_leader, self._k_epoch = f"{p}leader", f"{p}leader:epoch"
        self._acquire_script = self.redis.register_script(ACQUIRE)
        self._renew_script = self.redis.register_script(RENEW)
        self._release_script = self.redis.register_script(RELEASE)
        self._instance_script = self.redis.register_script(INSTANCE_CAS)
        self._forget_script = self.redis.register_script(FORGET_NODE)
        self._ack_script = self.redis.register_script(ACK_NODE)
        self._k_instances, self._k_live = f"{p}instances", f"{p}instances:live"
        self._k_blocks = f"{p}blocks"
        self._report_nodes: list[str] = []  # the nodes whose report streams the last take read
        self._reports_done: dict[str, list[str]] = {}  # applied, deleted with the next take

    # -- keys ----------------------------------------------------------------------------------

    def _k_job(self, job_id: str) -> str:
        return f"{self.prefix}job:{job_id}"

    def _k_node(self, node_id: str) -> str:
        return NodeKeys(self.prefix, node_id).node

    def _k_alloc(self, node_id: str) -> str:
        return NodeKeys(self.prefix, node_id).alloc

    def _k_view(self, node_id: str) -> str:
        return NodeKeys(self.prefix, node_id).view

    def _k_reports(self, node_id: str) -> str:
        return NodeKeys(self.prefix, node_id).reports

    @property
    def _k_hello(self) -> str:
        return f"{self.prefix}{HELLO}"

    def _run_scripts(self, calls: Sequence[tuple[Any, list[str], list[Any]]]) -> list[Any]:
        """Run Lua scripts (script, keys, args) in one pipelined round trip, by their SHA.
        (A redis-py pipeline asks the server first whether its scripts exist, a round trip
        more every time; here a script the server lost, after a restart or SCRIPT FLUSH, is
        loaded when it answers NOSCRIPT and only the refused calls run again.)"""
        pipe = self.redis.pipeline(transaction=False)
        for script, keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        out = pipe.execute(raise_on_error=False)
        missing = [i for i, r in enumerate(out) if isinstance(r, NoScriptError)]
        if missing:
            for script in {id(calls[i][0]): calls[i][0] for i in missing}.values():
                script.sha = self.redis.script_load(script.script)
            pipe = self.redis.pipeline(transaction=False)
            for i in missing:
                script, keys, args = calls[i]
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            for i, r in zip(missing, pipe.execute(raise_on_error=False)):
                out[i] = r
        for r in out:
            if isinstance(r, Exception):
                raise r
        return out

    @contextmanager
    def _gathered(self) -> Iterator[None]:
        """Reasons, queue order and reservation written inside the block go in one
        transaction (MULTI/EXEC), sent when the block ends."""
        if getattr(self._gather, "pipe", None) is not None:
            yield
            return
        self._gather.pipe = pipe = self.redis.pipeline(transaction=True)
        try:
            yield
        finally:
            self._gather.pipe = None
        if pipe.command_stack:
            pipe.execute()

    def _writer(self) -> Any:
        """Where a write goes: the gathered pipeline inside :meth:`_gathered`, else Redis."""
        pipe = getattr(self._gather, "pipe", None)
        return self.redis if pipe is None else pipe
