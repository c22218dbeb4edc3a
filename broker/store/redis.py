"""Redis store: the production backend, same rules and semantics as :class:`MemoryStore`.

Layout, every key under ``prefix`` (default ``sw:``)::

    job:{id}              HASH   doc (Job JSON), version, state, attempt (mirrored for Lua)
    jobs:all              ZSET   every job id, scored by submitted_at
    jobs:pending          ZSET   ids of PENDING jobs
    jobs:active           ZSET   ids of STARTING, RUNNING and STOPPING jobs
    node:{id}             HASH   doc (Node JSON), state, incarnation, lease_expires (its
                                 agent's), acked (the incarnation the scheduler took: a node
                                 takes jobs only while it is the current one)
    nodes                 ZSET   every node id, scored by first registration (nodes:seq)
    nodes:hello           STREAM n (node id): agents that registered, for the scheduler
    alloc:{node}          HASH   GPU id -> owner ("job:attempt")
    run:{node}            HASH   the node's view, what its agent reads of jobs: {job} -> doc,
                                 a:{job} -> attempt, s:{job} -> sealed spec, for the jobs
                                 that run there (written with each job write)
    reports:{node}        STREAM the agent's reports (started, exited, preempted, registered),
                                 applied by the leading scheduler (store/node_reports.py)
    reasons               HASH   job id -> JSON [code, message(, burst outlook)]
    logs:{job}:{attempt}@{node}  STREAM t (time), s ("out" or "err"), x (text): one per node
                                 of the attempt, written by that node's agent
    usage                 HASH   team -> JSON [decayed GPU-seconds, as of time]
    runtimes              STREAM s (JSON [team, name, GPUs, limit, runtime]) of finished jobs
    reservation           STRING JSON of the reservation the last cycle made (EASY backfill)
    archive               HASH   job id -> zlib-compressed Job JSON of jobs finished more
                                 than retain_finished_s ago (out of every other key)
    spec:{id}             STRING the job's spec as submitted, written once (SET NX); copied
                                 into the views of the nodes that run it (security/seal.py)
    order                 STRING the last cycle's queue: "<time> <count>\n" then the first
                                 ORDER_CAP job ids, space-separated (rewritten each cycle)
    inst:{request id}     HASH   doc (Instance JSON), version: one rented machine (kept after it
                                 ended: the ledger of launches and terminations)
    instances             ZSET   every instance's request id, scored by requested_at
    instances:live        ZSET   request ids of instances not TERMINATED or FAILED
    blocks                HASH   "provider:region:zone:type" -> JSON [until, reason]
    offers                STRING JSON of the offers the provisioner could rent, with a time
    boots                 HASH   offer id -> JSON [seconds, machines seen, last seen]: its
                                 machines' boot estimate (store/boots.py)

Each compare-and-set write is one Lua script, so it is atomic on the server; many of them go
in one pipelined round trip. The ``state``, ``incarnation`` and ``lease_expires`` fields of a
node hash are authoritative over the copies inside its ``doc``.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import redis

from broker.config.core import Config
from broker.model import Instance, Job, Node
from broker.model.state import ACTIVE, JobState
from broker.security import seal
from broker.store.redis_keys import NODE_FIELDS, _str
from broker.store.redis_records import RedisRecords

if TYPE_CHECKING:  # (for the types only: reading a job needs no Change)
    from broker.store.transitions import Change

_CHUNK = 1000  # commands per pipeline


def _view_nodes(c: Change) -> tuple[set[str], list[str]]:
    """The nodes whose view (``run:{node}``, what their agents read) a change touches: those
    where the job runs after it (``here``), and those it may have run on before (its last
    attempts, the GPUs it claims or releases), sorted."""
    job = c.job
    here = {a.node_id for a in job.allocations} if job.state in ACTIVE else set()
    before = {a.node_id for att in job.attempts[-2:] for a in att.allocations}
    touched = here | before | {n for n, _ in c.claim} | {n for n, _ in c.release}
    return here, sorted(touched)


def _chunks(items: Sequence[Any], size: int = _CHUNK) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


class RedisStore(RedisRecords):
    """The store on one Redis server (6.2 or later; not Redis Cluster: a script touches a job,
    its nodes and the indexes together). The jobs are here; the records beside them (nodes,
    reasons, usage, instances, leadership) in :mod:`broker.store.redis_records`, the logs in
    :mod:`broker.store.redis_logs`, the connection, keys and scripts in
    :mod:`broker.store.redis_base`."""

    def __init__(self, url_or_client: str | redis.Redis, config: Config | None = None,
                 prefix: str = "sw:", cache_size: int = 100_000) -> None:
        self._parsed: dict[str, tuple[bytes | str, Job]] = {}  # job id -> (doc, Job)
        self._read_instances: list[Instance] | None = None  # read with the last state
        self._budget_read: tuple[Any, Any] | None = None  # the budget book's, likewise
        # per index: the last read's raw id -> version, its jobs and their order
        self._last_index: dict[str, tuple[dict[bytes, bytes], dict[bytes, Job],
                                          list[bytes]]] = {}
        self._cache_size = cache_size
        self._owns_client = isinstance(url_or_client, str)
        super().__init__(redis.Redis.from_url(url_or_client) if isinstance(url_or_client, str)
                         else url_or_client, config, prefix)

    def close(self) -> None:
        """Close the connection pool if this store created the client."""
        if self._owns_client:
            self.redis.close()

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
        from broker.store.budgets import budget_book

        budget_book(self).queue_committed(pipe)  # type: ignore[attr-defined]
        if cursor is not None:
            pipe.xrange(self._k_runtimes, min=f"({cursor}" if cursor != "0" else "-",
                        count=5000)
        pk, pv, ak, av, members, raw_usage, reservation, live, caps, reserved, *rest = \
            pipe.execute()
        self._budget_read = (caps, reserved)
        raws = {"pending": self._index_raw(pk, pv), "active": self._index_raw(ak, av)}
        known = {w: self._index_known(w, raw) for w, raw in raws.items()}
        node_ids = [_str(m) for m in members]
        pipe = self.redis.pipeline(transaction=False)
        for node_id in node_ids:
            pipe.hmget(self._k_node(node_id), NODE_FIELDS)
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

    def _snapshot_budget_read(self) -> tuple[Any, Any] | None:
        read, self._budget_read = self._budget_read, None
        return read

    def _snapshot_instances(self) -> list[Instance]:
        read, self._read_instances = self._read_instances, None
        return super()._snapshot_instances() if read is None else read

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

    def spec_problems(self, jobs: Sequence[Job]) -> dict[str, str]:
        return seal.problems(self.redis, self.prefix, jobs)

    def seal_existing(self, now: float) -> int:
        live = [j for j in self.get_many(self._index("pending") + self._index("active")) if j]
        return seal.seal_existing(self.redis, self.prefix, live, self.prefix + "spec-sealing",
                                  now)

    def _start_copies(self, job_ids: Sequence[str]) -> list[tuple[Job | None, str]]:
        """The copies parsed from the bytes this process last read or wrote (the snapshot's,
        as a rule: no read), each proven in the commit by its document's SHA-1: a record
        rewritten since, even without a new version, refuses the start (CHANGED) and is read
        again by the next snapshot (:meth:`_forget`)."""
        missing = [i for i in job_ids if i not in self._parsed]
        if missing:
            self._load(missing)
        parsed = self._parsed  # (after the read: a full cache starts a new dict)
        out: list[tuple[Job | None, str]] = []
        for job_id in job_ids:
            hit = parsed.get(job_id)
            if hit is None:
                out.append((None, ""))
                continue
            doc = hit[0] if isinstance(hit[0], bytes) else hit[0].encode()
            out.append((hit[1], hashlib.sha1(doc, usedforsecurity=False).hexdigest()))
        return out

    def _forget(self, job_ids: Sequence[str]) -> None:
        for job_id in job_ids:
            self._parsed.pop(job_id, None)
            k = job_id.encode()
            for raw, _, _ in self._last_index.values():
                raw.pop(k, None)

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
        here, views = _view_nodes(c)
        keys.append(seal.seal_key(self.prefix, job.id))
        keys += [self._k_view(n) for n in views]
        keys += [self._k_ver_pending, self._k_ver_active, self._k_reasons, self._k_leader]
        args: list[Any] = [
            c.expected_version, job.version, json.dumps(job.to_dict(), separators=(",", ":")),
            job.state.value, job.attempt, repr(float(job.submitted_at)), job.id,
            int(job.state is JobState.PENDING), int(job.state in ACTIVE), c.owner,
            c.release_owner, len(c.claim), len(c.release),
        ]
        args += [gpu for _, gpu in c.claim]
        args += [gpu for _, gpu in c.release]
        args.append(len(views))
        args += [int(n in here) for n in views]
        args.append(c.expected_doc)
        args.append(self.fence_token() or "")
        return keys, args

    def _index(self, which: str) -> list[str]:
        key = {"pending": self._k_pending, "active": self._k_active, "all": self._k_all}[which]
        # equal scores sort by member, so this is (submitted_at, id) order
        return [_str(m) for m in self.redis.zrange(key, 0, -1)]

    def count_ids(self, which: str) -> int:
        key = {"pending": self._k_pending, "active": self._k_active, "all": self._k_all}[which]
        return int(self.redis.zcard(key))
