"""Redis store: the production backend, same rules and semantics as :class:`MemoryStore`.

Layout, every key under ``prefix`` (default ``sw:``)::

    job:{id}              HASH   doc (Job JSON), version, state, attempt (mirrored for Lua)
    jobs:all              ZSET   every job id, scored by submitted_at
    jobs:pending          ZSET   ids of PENDING jobs
    jobs:active           ZSET   ids of STARTING, RUNNING and STOPPING jobs
    node:{id}             HASH   doc (Node JSON), state, incarnation, lease_expires
    nodes                 ZSET   every node id, scored by first registration (nodes:seq)
    alloc:{node}          HASH   GPU id -> owner ("job:attempt")
    reasons               HASH   job id -> JSON [code, message]
    logs:{job}:{attempt}  STREAM t (time), s ("out" or "err"), x (text)
    usage                 HASH   team -> JSON [decayed GPU-seconds, as of time]
    runtimes              STREAM s (JSON [team, name, GPUs, limit, runtime]) of finished jobs
    reservation           STRING JSON of the reservation the last cycle made (EASY backfill)
    archive               HASH   job id -> zlib-compressed Job JSON of jobs finished more
                                 than retain_finished_s ago (out of every other key)
    spec:{id}             STRING the job's spec as submitted, written once (SET NX): agents,
                                 who write job records, may only read it (security/seal.py)
    order                 STRING the last cycle's queue: "<time> <count>\n" then the first
                                 ORDER_CAP job ids, space-separated (rewritten each cycle)
    inst:{request id}     HASH   doc (Instance JSON), version: one rented machine (kept after it
                                 ended: the ledger of launches and terminations)
    instances             ZSET   every instance's request id, scored by requested_at
    instances:live        ZSET   request ids of instances not TERMINATED or FAILED
    blocks                HASH   "provider:region:zone:type" -> JSON [until, reason]
    offers                STRING JSON of the offers the provisioner could rent, with a time

Each compare-and-set write is one Lua script, so it is atomic on the server; many of them go
in one pipelined round trip. The ``state``, ``incarnation`` and ``lease_expires`` fields of a
node hash are authoritative over the copies inside its ``doc``.
"""

from __future__ import annotations

import json
import threading
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import redis
from redis.exceptions import NoScriptError

from broker.config import Config
from broker.errors import StaleAttempt
from broker.model import Instance, Job, Node, NodeState, Reason
from broker.security import seal
from broker.state import ACTIVE, JobState
from broker.store.base import ORDER_CAP, BaseStore, LogLine, QueueOrder
from broker.store.instances import Block
from broker.store.lua import (
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
from broker.store.transitions import Change

LOG_MAXLEN = 100_000  # approximate cap (MAXLEN ~) on one attempt's log stream
LOG_TTL_S = 7 * 86400  # a log stream lives this long after its last line
_CHUNK = 1000  # commands per pipeline

def _str(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _chunks(items: Sequence[Any], size: int = _CHUNK) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


RUNTIME_SAMPLES = 50_000  # finished runtimes kept for the predictor


class RedisStore(BaseStore):
    """The store on one Redis server (6.2 or later; not Redis Cluster: a script touches a job,
    its nodes and the indexes together)."""

    def __init__(self, url_or_client: str | redis.Redis, config: Config | None = None,
                 prefix: str = "sw:", cache_size: int = 100_000) -> None:
        super().__init__(config)
        self._parsed: dict[str, tuple[bytes | str, Job]] = {}  # job id -> (doc, Job)
        self._read_instances: list[Instance] | None = None  # read with the last state
        self._parsed_nodes: dict[str, tuple[bytes | str, Node]] = {}
        # per index: the last read's raw id -> version, its jobs and their order
        self._last_index: dict[str, tuple[dict[bytes, bytes], dict[bytes, Job],
                                          list[bytes]]] = {}
        self._gather = threading.local()  # .pipe: apply()'s last writes, sent together
        self._cache_size = cache_size
        self._owns_client = isinstance(url_or_client, str)
        self.redis: redis.Redis = (
            redis.Redis.from_url(url_or_client) if isinstance(url_or_client, str)
            else url_or_client
        )
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
        self._k_order = f"{p}order"
        self._k_archive = f"{p}archive"
        self._k_leader, self._k_epoch = f"{p}leader", f"{p}leader:epoch"
        self._acquire_script = self.redis.register_script(ACQUIRE)
        self._renew_script = self.redis.register_script(RENEW)
        self._release_script = self.redis.register_script(RELEASE)
        self._instance_script = self.redis.register_script(INSTANCE_CAS)
        self._forget_script = self.redis.register_script(FORGET_NODE)
        self._k_instances, self._k_live = f"{p}instances", f"{p}instances:live"
        self._k_blocks = f"{p}blocks"

    def close(self) -> None:
        """Close the connection pool if this store created the client."""
        if self._owns_client:
            self.redis.close()

    # -- keys ----------------------------------------------------------------------------------

    def _k_job(self, job_id: str) -> str:
        return f"{self.prefix}job:{job_id}"

    def _k_node(self, node_id: str) -> str:
        return f"{self.prefix}node:{node_id}"

    def _k_alloc(self, node_id: str) -> str:
        return f"{self.prefix}alloc:{node_id}"

    def _k_logs(self, job_id: str, attempt: int) -> str:
        return f"{self.prefix}logs:{job_id}:{attempt}"

    # -- jobs ----------------------------------------------------------------------------------

    def _load(self, job_ids: Sequence[str]) -> list[Job | None]:
        out: list[Job | None] = []
        for chunk in _chunks(job_ids):
            pipe = self.redis.pipeline(transaction=False)
            for job_id in chunk:
                pipe.hget(self._k_job(job_id), "doc")
            out += [self._parse(job_id, doc) for job_id, doc in zip(chunk, pipe.execute())]
        return out

    def _archive(self, jobs: Sequence[Job]) -> None:
        pipe = self.redis.pipeline(transaction=True)
        for job in jobs:
            doc = json.dumps(job.to_dict(), separators=(",", ":")).encode()
            pipe.hset(self._k_archive, job.id, zlib.compress(doc))
            pipe.delete(self._k_job(job.id))
            pipe.zrem(self._k_all, job.id)
            pipe.hdel(self._k_reasons, job.id)
            pipe.delete(seal.seal_key(self.prefix, job.id))
        pipe.execute()
        for job in jobs:
            self._parsed.pop(job.id, None)

    def _load_archived(self, job_id: str) -> Job | None:
        raw = self.redis.hget(self._k_archive, job_id)
        if raw is None:
            return None
        return Job.from_dict(json.loads(zlib.decompress(raw if isinstance(raw, bytes)
                                                        else raw.encode("latin-1"))))

    def _load_index(self, which: str) -> list[Job]:
        """The jobs of the ``pending`` or ``active`` index, oldest first: its id -> version
        hash, then documents only for jobs not already parsed at that version."""
        pipe = self.redis.pipeline(transaction=True)
        self._queue_index(pipe, which)
        raw = self._index_raw(*pipe.execute())
        jobs, stale = self._index_known(which, raw)
        return self._index_jobs(which, raw, jobs, stale, self._load([k.decode() for k in stale]))

    def _queue_index(self, pipe: Any, which: str) -> None:
        # HKEYS and HVALS in one MULTI/EXEC (the same order): zipped in C, where redis-py
        # builds HGETALL's dict in Python (half the cost of this read on a long queue)
        key = {"pending": self._k_ver_pending, "active": self._k_ver_active}[which]
        pipe.hkeys(key)
        pipe.hvals(key)

    @staticmethod
    def _index_raw(keys: list[bytes], values: list[bytes]) -> dict[bytes, bytes]:
        return dict(zip(keys, values))

    def _index_known(self, which: str, raw: dict[bytes, bytes]
                     ) -> tuple[dict[bytes, Job], list[bytes]]:
        """The jobs of ``raw`` (id -> version) already parsed at that version, and the ids
        whose documents must be read."""
        last_raw, last_jobs, _ = self._last_index.get(which, ({}, {}, []))
        jobs: dict[bytes, Job] = {}
        stale: list[bytes] = []
        parsed = self._parsed
        for k, v in raw.items():
            if last_raw.get(k) == v:
                jobs[k] = last_jobs[k]
                continue
            hit = parsed.get(k.decode())
            if hit is not None and hit[1].version == int(v):
                jobs[k] = hit[1]
            else:
                stale.append(k)
        return jobs, stale

    def _index_jobs(self, which: str, raw: dict[bytes, bytes], jobs: dict[bytes, Job],
                    stale: list[bytes], loaded: Sequence[Job | None]) -> list[Job]:
        """The index's jobs, oldest first. A job's place never changes (it is its submission
        time), so the last read's order is reused while no job joined the index."""
        for k, job in zip(stale, loaded):
            if job is not None:
                jobs[k] = job
        _, last_jobs, last_order = self._last_index.get(which, ({}, {}, []))
        if last_jobs.keys() >= jobs.keys():
            order = [k for k in last_order if k in jobs]
        else:
            order = sorted(jobs, key=lambda k: (jobs[k].submitted_at, jobs[k].id))
        if len(jobs) < len(raw):  # (a job deleted since its index entry was read)
            raw = {k: v for k, v in raw.items() if k in jobs}
        self._last_index[which] = (raw, jobs, order)
        return [jobs[k] for k in order]

    def _read_state(self, cursor: str | None) -> tuple[
            list[Job], list[Job], list[Node], dict[str, dict[str, str]],
            tuple[dict[str, tuple[float, float]], list[tuple[str, str, int, float, float]],
                  str | None, str | None]]:
        """Two round trips: the indexes, the node ids, the live instances' ids and the
        metadata in one MULTI; then the nodes, their allocations, the instances and the job
        documents not parsed yet (the instances are kept for :meth:`_snapshot_instances`)."""
        pipe = self.redis.pipeline(transaction=True)
        self._queue_index(pipe, "pending")
        self._queue_index(pipe, "active")
        pipe.zrange(self._k_nodes, 0, -1)
        pipe.hgetall(self._k_usage)
        pipe.get(self._k_reservation)
        pipe.zrange(self._k_live, 0, -1)
        if cursor is not None:
            pipe.xrange(self._k_runtimes, min=f"({cursor}" if cursor != "0" else "-",
                        count=5000)
        pk, pv, ak, av, members, raw_usage, reservation, live, *rest = pipe.execute()
        raws = {"pending": self._index_raw(pk, pv), "active": self._index_raw(ak, av)}
        known = {w: self._index_known(w, raw) for w, raw in raws.items()}
        node_ids = [_str(m) for m in members]
        pipe = self.redis.pipeline(transaction=False)
        for node_id in node_ids:
            pipe.hmget(self._k_node(node_id), ["doc", "state", "incarnation", "lease_expires"])
        for node_id in node_ids:
            pipe.hgetall(self._k_alloc(node_id))
        stale = known["pending"][1] + known["active"][1]
        for k in stale:
            pipe.hget(self._k_job(k.decode()), "doc")
        for rid in live:
            pipe.hmget(f"{self.prefix}inst:{_str(rid)}", ["doc", "version"])
        replies = pipe.execute()
        if live:
            self._read_instances = [Instance.from_dict(json.loads(doc))
                                    for doc, _ in replies[len(replies) - len(live):]
                                    if doc is not None]
            replies = replies[:len(replies) - len(live)]
        else:
            self._read_instances = []
        n = len(node_ids)
        nodes = self._nodes_from(node_ids, replies[:n])
        allocated = {node_id: {_str(g): _str(o) for g, o in held.items()}
                     for node_id, held in zip(node_ids, replies[n:2 * n])}
        docs = [self._parse(k.decode(), doc) for k, doc in zip(stale, replies[2 * n:])]
        np_ = len(known["pending"][1])
        pending = self._index_jobs("pending", raws["pending"], *known["pending"], docs[:np_])
        active = self._index_jobs("active", raws["active"], *known["active"], docs[np_:])
        usage = self._parse_usage(raw_usage)
        res = None if reservation is None else _str(reservation)
        if cursor is None:
            return pending, active, nodes, allocated, (usage, [], None, res)
        batch = rest[0]
        samples, cursor = self._parse_samples(batch, cursor)
        if len(batch) == 5000:  # a long backlog (a new scheduler): read the rest
            more, cursor = self._read_runtimes(cursor)
            samples += more
        return pending, active, nodes, allocated, (usage, samples, cursor, res)

    def _parse(self, job_id: str, doc: bytes | str | None) -> Job | None:
        """Decode a job document, reusing the Job parsed from the very same bytes last time
        (Jobs are immutable; a snapshot re-reads mostly unchanged jobs every cycle)."""
        if doc is None:
            return None
        hit = self._parsed.get(job_id)
        if hit is not None and hit[0] == doc:
            return hit[1]
        job = Job.from_dict(json.loads(doc))
        self._remember(job, doc if isinstance(doc, bytes) else doc.encode())
        return job

    def _commit(self, changes: Sequence[Change]) -> list[str]:
        out: list[str] = []
        for chunk in _chunks(changes):
            new = [c.job for c in chunk if c.expected_version == 0]
            if new:  # each new job's spec, sealed where agents cannot write it
                pipe = self.redis.pipeline(transaction=False)
                seal.write(pipe, self.prefix, new)
                pipe.execute()
            calls, docs = [], []
            for change in chunk:
                keys, args = self._commit_args(change)
                docs.append(args[2])
                calls.append((self._commit_script, keys, args))
            statuses = [_str(s) for s in self._run_scripts(calls)]
            for change, doc, status in zip(chunk, docs, statuses):
                if status == "ok":  # what this process wrote needs no parsing when read back
                    self._remember(change.job, doc.encode())
            out += statuses
        return out

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

    def spec_problems(self, jobs: Sequence[Job]) -> dict[str, str]:
        return seal.problems(self.redis, self.prefix, jobs)

    def get_many_checked(self, job_ids: Sequence[str]
                         ) -> tuple[list[Job | None], dict[str, str]]:
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hget(self._k_job(job_id), "doc")
        pipe.mget([seal.seal_key(self.prefix, j) for j in job_ids] or ["-"])
        *docs, sealed = pipe.execute()
        jobs = [self._parse(job_id, doc) for job_id, doc in zip(job_ids, docs)]
        found = [(j, raw) for j, raw in zip(jobs, sealed) if j is not None]
        return jobs, seal.judge([j for j, _ in found], [raw for _, raw in found])

    def seal_existing(self, now: float) -> int:
        live = [j for j in self.get_many(self._index("pending") + self._index("active")) if j]
        return seal.seal_existing(self.redis, self.prefix, live, self.prefix + "spec-sealing",
                                  now)

    def _cached_jobs(self, job_ids: Sequence[str]) -> list[Job | None]:
        parsed = self._parsed
        return [None if (hit := parsed.get(i)) is None else hit[1] for i in job_ids]

    def _remember(self, job: Job, doc: bytes) -> None:
        if len(self._parsed) >= self._cache_size:
            self._parsed = {}
        self._parsed[job.id] = (doc, job)

    def _commit_args(self, c: Change) -> tuple[list[str], list[Any]]:
        job = c.job
        keys = [self._k_job(job.id), self._k_all, self._k_pending, self._k_active]
        for node_id, _ in c.claim:
            keys += [self._k_node(node_id), self._k_alloc(node_id)]
        keys += [self._k_alloc(node_id) for node_id, _ in c.release]
        keys += [self._k_ver_pending, self._k_ver_active, self._k_reasons, self._k_leader]
        args: list[Any] = [
            c.expected_version, job.version, json.dumps(job.to_dict(), separators=(",", ":")),
            job.state.value, job.attempt, repr(float(job.submitted_at)), job.id,
            int(job.state is JobState.PENDING), int(job.state in ACTIVE), c.owner,
            c.release_owner, len(c.claim), len(c.release),
        ]
        args += [gpu for _, gpu in c.claim]
        args += [gpu for _, gpu in c.release]
        args.append(self.fence_token() or "")
        return keys, args

    def _index(self, which: str) -> list[str]:
        key = {"pending": self._k_pending, "active": self._k_active, "all": self._k_all}[which]
        # equal scores sort by member, so this is (submitted_at, id) order
        return [_str(m) for m in self.redis.zrange(key, 0, -1)]

    def count_ids(self, which: str) -> int:
        key = {"pending": self._k_pending, "active": self._k_active, "all": self._k_all}[which]
        return int(self.redis.zcard(key))

    # -- nodes ---------------------------------------------------------------------------------

    def _put_node(self, node: Node, lease_expires: float) -> None:
        # The document holds what rarely changes; state, incarnation and lease are fields of
        # their own, so a heartbeat leaves the document (and its parsed copy) as it was.
        doc = json.dumps(replace(node, state=NodeState.READY, incarnation="",
                                 lease_expires=0.0).to_dict(), separators=(",", ":"))
        self._put_node_script(
            [self._k_node(node.id), self._k_nodes, self._k_node_seq],
            [node.id, doc, node.state.value, node.incarnation, repr(float(lease_expires))],
        )

    def _node_ids(self) -> list[str]:
        """Node ids in the order they first registered (as MemoryStore keeps them)."""
        return [_str(m) for m in self.redis.zrange(self._k_nodes, 0, -1)]

    def _load_nodes(self) -> list[Node]:
        ids = self._node_ids()
        pipe = self.redis.pipeline(transaction=False)
        for node_id in ids:
            pipe.hmget(self._k_node(node_id), ["doc", "state", "incarnation", "lease_expires"])
        return self._nodes_from(ids, pipe.execute())

    def _nodes_from(self, ids: Sequence[str], rows: Sequence[Any]) -> list[Node]:
        out = []
        for node_id, (doc, state, incarnation, lease) in zip(ids, rows):
            if doc is None:
                continue
            hit = self._parsed_nodes.get(node_id)
            if hit is not None and hit[0] == doc:
                node = hit[1]
            else:
                node = Node.from_dict(json.loads(doc))
                self._parsed_nodes[node_id] = (doc, node)
            out.append(replace(node, state=NodeState(_str(state)),
                               incarnation=_str(incarnation), lease_expires=float(lease)))
        return out

    def _mark_down(self, node_id: str, expected_incarnation: str, now: float) -> bool:
        keys = [self._k_node(node_id), self._k_alloc(node_id)]
        return bool(self._mark_down_script(keys, [expected_incarnation, repr(float(now))]))

    def _forget_node(self, node_id: str, incarnation: str) -> bool:
        keys = [self._k_node(node_id), self._k_nodes, self._k_alloc(node_id)]
        gone = bool(self._forget_script(keys, [node_id, incarnation]))
        if gone:
            self._parsed_nodes.pop(node_id, None)
        return gone

    def allocations(self, node_ids: Iterable[str] | None = None) -> dict[str, dict[str, str]]:
        ids = self._node_ids() if node_ids is None else list(node_ids)
        pipe = self.redis.pipeline(transaction=False)
        for node_id in ids:
            pipe.hgetall(self._k_alloc(node_id))
        return {
            node_id: {_str(g): _str(o) for g, o in held.items()}
            for node_id, held in zip(ids, pipe.execute())
        }

    # -- reasons -------------------------------------------------------------------------------

    def _write_reasons(self, set_: Mapping[str, Reason], delete: Sequence[str]) -> None:
        if not set_ and not delete:
            return
        gathered = getattr(self._gather, "pipe", None)
        pipe = gathered if gathered is not None else self.redis.pipeline(transaction=True)
        if delete:
            pipe.hdel(self._k_reasons, *delete)
        if set_:
            pipe.hset(self._k_reasons, mapping={
                k: json.dumps([r.code, r.message]) for k, r in set_.items()
            })
        if gathered is None:
            pipe.execute()

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

    def _read_reasons(self, job_ids: Sequence[str]) -> list[Reason | None]:
        if not job_ids:
            return []
        raw = self.redis.hmget(self._k_reasons, list(job_ids))
        return [None if r is None else Reason(*json.loads(r)) for r in raw]

    # -- fair-share usage, runtime samples, the reservation ----------------------------------

    def _add_usage(self, team: str, gpu_s: float, now: float, half_life_s: float,
                   sample: tuple[str, str, int, float, float] | None = None) -> None:
        self._usage_script([self._k_usage, self._k_runtimes],
                           [team, repr(float(gpu_s)), repr(float(now)), repr(float(half_life_s)),
                            RUNTIME_SAMPLES, json.dumps(list(sample)) if sample else ""])

    def _add_usage_many(self, usages: Sequence[tuple[str, float, float, float,
                                                     tuple[str, str, int, float, float] | None]]
                        ) -> None:
        self._run_scripts([(self._usage_script, [self._k_usage, self._k_runtimes],
                            [team, repr(float(gpu_s)), repr(float(now)),
                             repr(float(half_life_s)), RUNTIME_SAMPLES,
                             json.dumps(list(sample)) if sample else ""])
                           for team, gpu_s, now, half_life_s, sample in usages])

    def _read_meta(self, cursor: str | None) -> tuple[dict[str, tuple[float, float]],
                                                      list[tuple[str, str, int, float, float]],
                                                      str | None, str | None]:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self._k_usage)
        pipe.get(self._k_reservation)
        if cursor is not None:
            pipe.xrange(self._k_runtimes, min=f"({cursor}" if cursor != "0" else "-",
                        count=5000)
        raw_usage, reservation, *rest = pipe.execute()
        usage = self._parse_usage(raw_usage)
        if cursor is None:
            return usage, [], None, None if reservation is None else _str(reservation)
        batch = rest[0]
        samples, cursor = self._parse_samples(batch, cursor)
        if len(batch) == 5000:  # a long backlog (a new scheduler): read the rest
            more, cursor = self._read_runtimes(cursor)
            samples += more
        return usage, samples, cursor, None if reservation is None else _str(reservation)

    @staticmethod
    def _parse_samples(batch: Any, cursor: str
                       ) -> tuple[list[tuple[str, str, int, float, float]], str]:
        out: list[tuple[str, str, int, float, float]] = []
        for entry_id, fields_ in batch:
            team, name, gpus, limit, ran = json.loads((fields_ or {})[b"s"])
            out.append((team, name, int(gpus), float(limit), float(ran)))
            cursor = _str(entry_id)
        return out, cursor

    def _read_usage(self) -> dict[str, tuple[float, float]]:
        return self._parse_usage(self.redis.hgetall(self._k_usage))

    @staticmethod
    def _parse_usage(raw_usage: Any) -> dict[str, tuple[float, float]]:
        out = {}
        for team, raw in raw_usage.items():
            value, at = json.loads(raw)
            out[_str(team)] = (float(value), float(at))
        return out

    def _read_runtimes(self, cursor: str) -> tuple[list[tuple[str, str, int, float, float]],
                                                   str]:
        out: list[tuple[str, str, int, float, float]] = []
        while True:
            batch = self.redis.xrange(self._k_runtimes, min=f"({cursor}" if cursor != "0"
                                      else "-", count=5000)
            if not batch:
                return out, cursor
            more, cursor = self._parse_samples(batch, cursor)
            out += more

    def _put_reservation(self, data: str | None) -> None:
        if data is None:
            self._writer().delete(self._k_reservation)
        else:
            self._writer().set(self._k_reservation, data)

    def _get_reservation(self) -> str | None:
        raw = self.redis.get(self._k_reservation)
        return None if raw is None else _str(raw)

    def _put_order(self, ids: Sequence[str], at: float) -> None:
        head = f"{float(at)!r} {len(ids)}\n"
        self._writer().set(self._k_order, head + " ".join(ids[:ORDER_CAP]))

    def _get_order(self) -> QueueOrder | None:
        raw = self.redis.get(self._k_order)
        if raw is None:
            return None
        head, _, body = _str(raw).partition("\n")
        at, total = head.split()
        return QueueOrder(tuple(body.split()), int(total), float(at))

    # -- cloud instances -----------------------------------------------------------------------

    def _snapshot_instances(self) -> list[Instance]:
        read, self._read_instances = self._read_instances, None
        return super()._snapshot_instances() if read is None else read

    def _load_instances(self, request_ids: Sequence[str] | None = None,
                        live_only: bool = False) -> list[tuple[Instance, int]]:
        if request_ids is None:
            key = self._k_live if live_only else self._k_instances
            request_ids = [_str(m) for m in self.redis.zrange(key, 0, -1)]
        pipe = self.redis.pipeline(transaction=False)
        for rid in request_ids:
            pipe.hmget(f"{self.prefix}inst:{rid}", ["doc", "version"])
        out = []
        for doc, version in pipe.execute():
            if doc is not None:
                out.append((Instance.from_dict(json.loads(doc)), int(version)))
        return out

    def _cas_instance(self, inst: Instance, expected_version: int) -> str:
        doc = json.dumps(inst.to_dict(), separators=(",", ":"))
        keys = [f"{self.prefix}inst:{inst.request_id}", self._k_instances, self._k_live,
                self._k_leader]
        args: list[Any] = [expected_version, doc, repr(float(inst.requested_at)), inst.request_id,
                int(not inst.ended), self.fence_token() or ""]
        return _str(self._instance_script(keys, args))

    def _put_block(self, block: Block) -> None:
        self.redis.hset(self._k_blocks, block.key, json.dumps([block.until, block.reason]))

    def _put_offers(self, doc: str) -> None:
        self.redis.set(f"{self.prefix}offers", doc)

    def _get_offers(self) -> str | None:
        raw = self.redis.get(f"{self.prefix}offers")
        return None if raw is None else _str(raw)

    def _load_blocks(self) -> list[Block]:
        out = []
        for key, raw in self.redis.hgetall(self._k_blocks).items():
            until, reason = json.loads(raw)
            out.append(Block(_str(key), float(until), str(reason)))
        return out

    # -- leadership ----------------------------------------------------------------------------

    def _acquire(self, owner: str, ttl_s: float, now: float) -> str | None:
        token = self._acquire_script([self._k_leader, self._k_epoch],
                                     [owner, max(1, int(ttl_s * 1000))])
        return None if token is None else _str(token)

    def _renew(self, token: str, ttl_s: float, now: float) -> bool:
        return bool(self._renew_script([self._k_leader], [token, max(1, int(ttl_s * 1000))]))

    def _release(self, token: str) -> None:
        self._release_script([self._k_leader], [token])

    def _leader(self, now: float) -> tuple[str, float] | None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(self._k_leader)
        pipe.pttl(self._k_leader)
        token, ttl_ms = pipe.execute()
        return None if token is None else (_str(token), max(0.0, ttl_ms / 1000))

    def store_started_at(self, now: float) -> float:
        """When the Redis server started (its uptime, against ``now``)."""
        return now - float(self.redis.info("server")["uptime_in_seconds"])

    # -- logs ----------------------------------------------------------------------------------

    def append_logs(self, job_id: str, attempt: int, lines: Sequence[tuple[str, str]],
                    now: float) -> None:
        args: list[Any] = [attempt, repr(float(now)), LOG_MAXLEN, LOG_TTL_S]
        for stream, text in lines:
            args += [stream, text]
        res = self._append_script([self._k_job(job_id), self._k_logs(job_id, attempt)], args)
        if int(res[0]) != 1:
            raise StaleAttempt(job_id, attempt, int(_str(res[1])), _str(res[2]))

    def read_logs(self, job_id: str, attempt: int, cursor: str = "0", limit: int = 1000,
                  block_s: float = 0.0) -> list[LogLine]:
        if limit <= 0:
            return []
        # As in MemoryStore, "", "0" and "$" all mean "from the first line".
        after = "0" if cursor in ("", "0", "$") else cursor
        block = max(1, int(block_s * 1000)) if block_s > 0 else None
        reply = self.redis.xread({self._k_logs(job_id, attempt): after}, count=limit,
                                 block=block)
        if not reply:
            return []
        if isinstance(reply, dict):  # RESP3: {key: [[entry, ...]]}
            streams = [entries for v in reply.values() for entries in v]
        else:  # RESP2: [[key, [entry, ...]]]
            streams = [entries for _, entries in reply]
        out = []
        for entries in streams:
            for entry in entries:
                entry_id, fields = entry[0], entry[1]  # type: ignore[index]
                f = {_str(k): v for k, v in fields.items()}  # type: ignore[union-attr]
                out.append(LogLine(_str(entry_id), float(_str(f["t"])), _str(f["s"]),
                                   _str(f["x"])))
        return out
