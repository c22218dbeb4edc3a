"""In-memory store for the simulator and unit tests: same rules as Redis, one process."""

from __future__ import annotations

import json
import threading
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from broker.config.core import Config
from broker.errors import StaleAttempt
from broker.model import BY_AGE, Instance, Job, Node, NodeState, Reason
from broker.model.state import ACTIVE, JobState
from broker.store.backend import ORDER_CAP, Block, LogLine, QueueOrder
from broker.store.base import BaseStore
from broker.store.status import BUSY, DEAD, FENCED, OK, VERSION
from broker.store.transitions import Change


class MemoryStore(BaseStore):
    def __init__(self, config: Config | None = None) -> None:
        super().__init__(config)
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._jobs: dict[str, Job] = {}
        self._order: dict[str, float] = {}
        self._pending: dict[str, None] = {}
        self._active: dict[str, None] = {}
        self._nodes: dict[str, Node] = {}
        self._alloc: dict[str, dict[str, str]] = {}
        self._reasons: dict[str, Reason] = {}
        self._logs: dict[tuple[str, int], list[LogLine]] = {}
        self._seq = 0
        self._usage: dict[str, tuple[float, float]] = {}
        self._runtimes: list[tuple[str, str, int, float, float]] = []
        self._reservation: str | None = None
        self._queue_order: QueueOrder | None = None
        self._failures: list[tuple[float, str]] = []  # failed cycles, newest first
        self._leadership: tuple[str, float] | None = None  # (token, lease end)
        self._epoch = 0
        self._archived: dict[str, bytes] = {}  # job id -> compressed JSON (retention)
        self._instances: dict[str, tuple[Instance, int]] = {}  # request id -> (record, version)
        self._blocks: dict[str, Block] = {}
        self._offers_doc: str | None = None
        self._boots: dict[str, str] = {}  # offer id -> its boot estimate (JSON)

    def _add_usage(self, team: str, gpu_s: float, now: float, half_life_s: float,
                   sample: tuple[str, str, int, float, float] | None = None) -> None:
        with self._lock:
            if sample is not None:
                self._runtimes.append(sample)
            value, at = self._usage.get(team, (0.0, now))
            self._usage[team] = (value * 0.5 ** (max(0.0, now - at) / half_life_s) + gpu_s,
                                 max(now, at))

    def _read_usage(self) -> dict[str, tuple[float, float]]:
        with self._lock:
            return dict(self._usage)

    def _read_runtimes(self, cursor: str) -> tuple[list[tuple[str, str, int, float, float]],
                                                   str]:
        with self._lock:
            start = int(cursor)
            return self._runtimes[start:], str(len(self._runtimes))

    def _put_reservation(self, data: str | None) -> None:
        self._reservation = data

    def _get_reservation(self) -> str | None:
        return self._reservation

    def _put_order(self, ids: Sequence[str], at: float) -> None:
        self._queue_order = QueueOrder(tuple(ids[:ORDER_CAP]), len(ids), at)

    def _get_order(self) -> QueueOrder | None:
        return self._queue_order

    def _put_cycle_failure(self, at: float, error: str, keep: int) -> None:
        with self._lock:
            self._failures = [(at, error), *self._failures][:keep]

    def _get_cycle_failures(self) -> list[tuple[float, str]]:
        with self._lock:
            return list(self._failures)

    def _load_instances(self, request_ids: Sequence[str] | None = None,
                        live_only: bool = False) -> list[tuple[Instance, int]]:
        with self._lock:
            if request_ids is not None:
                return [self._instances[r] for r in request_ids if r in self._instances]
            rows = [row for row in self._instances.values()
                    if not (live_only and row[0].ended)]
        return sorted(rows, key=lambda row: (row[0].requested_at, row[0].request_id))

    def _cas_instance(self, inst: Instance, expected_version: int) -> str:
        with self._lock:
            fence = self.fence_token()
            if fence is not None and (self._leadership is None or self._leadership[0] != fence):
                return FENCED
            cur = self._instances.get(inst.request_id)
            if (cur[1] if cur else 0) != expected_version:
                return VERSION
            self._instances[inst.request_id] = (inst, expected_version + 1)
            return OK

    def _put_block(self, block: Block) -> None:
        with self._lock:
            self._blocks[block.key] = block

    def _load_blocks(self) -> list[Block]:
        with self._lock:
            return list(self._blocks.values())

    def _put_offers(self, doc: str) -> None:
        self._offers_doc = doc

    def _get_offers(self) -> str | None:
        return self._offers_doc

    def _put_boot(self, offer_id: str, raw: str) -> None:
        with self._lock:
            self._boots[offer_id] = raw

    def _load_boots(self) -> dict[str, str]:
        with self._lock:
            return dict(self._boots)

    def _load(self, job_ids: Sequence[str]) -> list[Job | None]:
        with self._lock:
            return [self._jobs.get(i) for i in job_ids]

    def _archive(self, jobs: Sequence[Job]) -> None:
        with self._lock:
            for job in jobs:
                self._archived[job.id] = zlib.compress(
                    json.dumps(job.to_dict(), separators=(",", ":")).encode())
                self._jobs.pop(job.id, None)
                self._order.pop(job.id, None)
                self._reasons.pop(job.id, None)

    def _load_archived(self, job_id: str) -> Job | None:
        with self._lock:
            raw = self._archived.get(job_id)
        return None if raw is None else Job.from_dict(json.loads(zlib.decompress(raw)))

    def _acquire(self, owner: str, ttl_s: float, now: float) -> str | None:
        with self._lock:
            cur = self._leadership
            if cur is not None and cur[1] > now:
                if cur[0].partition(":")[2] != owner:
                    return None
                self._leadership = (cur[0], now + ttl_s)
                return cur[0]
            self._epoch += 1
            token = f"{self._epoch}:{owner}"
            self._leadership = (token, now + ttl_s)
            return token

    def _renew(self, token: str, ttl_s: float, now: float) -> bool:
        with self._lock:
            cur = self._leadership
            if cur is None or cur[0] != token or cur[1] <= now:
                return False
            self._leadership = (token, now + ttl_s)
            return True

    def _release(self, token: str) -> None:
        with self._lock:
            if self._leadership is not None and self._leadership[0] == token:
                self._leadership = None

    def _leader(self, now: float) -> tuple[str, float] | None:
        with self._lock:
            cur = self._leadership
            return None if cur is None or cur[1] <= now else (cur[0], cur[1] - now)

    def _commit(self, changes: Sequence[Change]) -> list[str]:
        with self._lock:
            return [self._commit_one(c) for c in changes]

    def _commit_one(self, c: Change) -> str:
        fence = self.fence_token()  # (leases end when another owner acquires at a later now)
        if fence is not None and (self._leadership is None or self._leadership[0] != fence):
            return FENCED
        job = c.job
        cur = self._jobs.get(job.id)
        if (cur.version if cur else 0) != c.expected_version:
            return VERSION
        for node_id, gpu in c.claim:
            node = self._nodes.get(node_id)
            if node is None or node.state is NodeState.DOWN:
                return DEAD
            owner = self._alloc.get(node_id, {}).get(gpu)
            if owner is not None and owner != c.owner:
                return BUSY
        for node_id, gpu in c.release:
            held = self._alloc.get(node_id, {})
            if held.get(gpu) == c.release_owner:
                del held[gpu]
        for node_id, gpu in c.claim:
            self._alloc.setdefault(node_id, {})[gpu] = c.owner
        self._jobs[job.id] = job
        self._order.setdefault(job.id, job.submitted_at)
        self._set_member(self._pending, job.id, job.state is JobState.PENDING)
        self._set_member(self._active, job.id, job.state in ACTIVE)
        if job.state is not JobState.PENDING:
            self._reasons.pop(job.id, None)
        return OK

    @staticmethod
    def _set_member(index: dict[str, None], key: str, member: bool) -> None:
        if member:
            index[key] = None
        else:
            index.pop(key, None)

    def _index(self, which: str) -> list[str]:
        with self._lock:
            src: dict[str, object] = {"pending": self._pending, "active": self._active,
                                      "all": self._order}[which]  # type: ignore[assignment]
            return sorted(src, key=lambda i: (self._order[i], i))

    def _record_reasons(self, pending: Mapping[str, Reason]) -> None:
        """In memory the whole map is replaced: cheaper than finding what changed."""
        with self._lock:
            self._reasons = dict(pending)

    def _load_index(self, which: str) -> list[Job]:
        """For a snapshot: oldest first (a C-level sort on the records themselves)."""
        with self._lock:
            src = self._pending if which == "pending" else self._active
            return sorted((self._jobs[i] for i in src), key=BY_AGE)

    def _put_node(self, node: Node, lease_expires: float) -> None:
        with self._lock:
            self._nodes[node.id] = replace(node, lease_expires=lease_expires)

    def _load_nodes(self) -> list[Node]:
        with self._lock:
            return list(self._nodes.values())

    def _mark_down(self, node_id: str, expected_incarnation: str, now: float) -> bool:
        with self._lock:
            node = self._nodes.get(node_id)
            if node is None or node.incarnation != expected_incarnation:
                return False
            if node.lease_expires > now:
                return False
            self._nodes[node_id] = replace(node, state=NodeState.DOWN)
            self._alloc.pop(node_id, None)
            return True

    def _forget_node(self, node_id: str, incarnation: str) -> bool:
        with self._lock:
            node = self._nodes.get(node_id)
            if node is None or node.state is not NodeState.DOWN or \
                    node.incarnation != incarnation:
                return False
            del self._nodes[node_id]
            self._alloc.pop(node_id, None)
            return True

    def allocations(self, node_ids: Iterable[str] | None = None) -> dict[str, dict[str, str]]:
        with self._lock:
            ids = list(self._nodes) if node_ids is None else list(node_ids)
            return {n: dict(self._alloc.get(n, {})) for n in ids}

    def _write_reasons(self, set_: Mapping[str, Reason], delete: Sequence[str]) -> None:
        with self._lock:
            for k in delete:
                self._reasons.pop(k, None)
            self._reasons.update(set_)

    def _read_reasons(self, job_ids: Sequence[str]) -> list[Reason | None]:
        with self._lock:
            return [self._reasons.get(i) for i in job_ids]

    def append_logs(self, job_id: str, attempt: int, lines: Sequence[tuple[str, str]],
                    now: float, node_id: str = "") -> None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or job.attempt != attempt or job.state not in ACTIVE or (
                    node_id and node_id not in job.node_ids):
                raise StaleAttempt(job_id, attempt, job.attempt if job else 0,
                                   job.state.value if job else "MISSING")
            log = self._logs.setdefault((job_id, attempt), [])
            for stream, text in lines:
                self._seq += 1
                log.append(LogLine(f"{self._seq}-0", now, stream, text))
            self._cond.notify_all()

    def read_logs(self, job_id: str, attempt: int, cursor: str = "0", limit: int = 1000,
                  block_s: float = 0.0) -> list[LogLine]:
        after = int(cursor.split("-")[0]) if cursor not in ("", "0", "$") else 0

        def fresh() -> list[LogLine]:
            log = self._logs.get((job_id, attempt), [])
            return [x for x in log if int(x.cursor.split("-")[0]) > after][:limit]

        with self._lock:
            out = fresh()
            if not out and block_s > 0:
                self._cond.wait(block_s)
                out = fresh()
            return out
