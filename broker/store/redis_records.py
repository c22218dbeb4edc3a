"""The Redis store's records beside the jobs: the keys and scripts of the layout in
:mod:`broker.store.redis`, and nodes and their allocations, pending reasons, fair-share usage
and runtime samples, the reservation and the queue order, cloud instances, offers and
blocks, leadership, and logs. :class:`broker.store.redis.RedisStore` adds the jobs (their
documents, indexes, snapshot reads and compare-and-set writes) on top.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import redis
from redis.exceptions import NoScriptError

from broker.config.core import Config
from broker.errors import StaleAttempt
from broker.model import Instance, Node, NodeState, Reason
from broker.store.backend import ORDER_CAP, LogLine, QueueOrder
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

if TYPE_CHECKING:  # (made where the blocks are read: reading a job needs none)
    from broker.store.instances import Block

LOG_MAXLEN = 100_000  # approximate cap (MAXLEN ~) on one attempt's log stream
LOG_TTL_S = 7 * 86400  # a log stream lives this long after its last line
RUNTIME_SAMPLES = 50_000  # finished runtimes kept for the predictor


#: The fields of a node's hash a snapshot reads (``acked``: the agent incarnation the scheduler
#: took; a node whose current incarnation it has not taken shows as DOWN).
NODE_FIELDS = ["doc", "state", "incarnation", "lease_expires", "acked"]


#: The stream where an agent says, once, that its node registered (after the store's prefix).
HELLO = "nodes:hello"


@dataclass(frozen=True)
class NodeKeys:
    """The keys of one node (after the store's ``prefix``): what its agent may touch
    (broker/security/acl.py agent_keys gives its user these, as patterns), and the store."""

    prefix: str
    node_id: str

    @property
    def node(self) -> str:  # its record: doc, state, incarnation, lease, acked
        return f"{self.prefix}node:{self.node_id}"

    @property
    def alloc(self) -> str:  # its GPUs' owners
        return f"{self.prefix}alloc:{self.node_id}"

    @property
    def view(self) -> str:  # the jobs placed on it, their attempts and sealed specs
        return f"{self.prefix}run:{self.node_id}"

    @property
    def reports(self) -> str:  # its agent's reports, for the leading scheduler
        return f"{self.prefix}reports:{self.node_id}"

    def logs(self, job_id: str, attempt: int | str) -> str:
        """Its log stream of one attempt (each node of a gang writes its own)."""
        return f"{self.prefix}logs:{job_id}:{attempt}@{self.node_id}"


def _str(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class RedisRecords(BaseStore):
    """Everything of the Redis store but the jobs (abstract: see :class:`RedisStore`)."""

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

    def _k_logs(self, job_id: str, attempt: int, node_id: str) -> str:
        return NodeKeys(self.prefix, node_id).logs(job_id, attempt)

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
            pipe.hmget(self._k_node(node_id), NODE_FIELDS)
        return self._nodes_from(ids, pipe.execute())

    def _nodes_from(self, ids: Sequence[str], rows: Sequence[Any]) -> list[Node]:
        out = []
        for node_id, (doc, state, incarnation, lease, acked) in zip(ids, rows):
            if doc is None:
                continue
            if acked != incarnation:  # a new agent the scheduler has not taken yet: no jobs
                state = NodeState.DOWN.value  # go there until it has (store/node_reports.py)
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

    def _node_acked(self, node_id: str) -> tuple[str, str] | None:
        inc, acked = self.redis.hmget(self._k_node(node_id), ["incarnation", "acked"])
        return None if inc is None else (_str(inc), _str(acked) if acked is not None else "")

    def take_node_reports(self, limit: int = 1000) -> list[tuple[str, list[tuple[str, Any]]]]:
        """Each node's waiting reports, oldest first: (node id, [(entry id, fields)]), for
        the nodes in the node list and those that said hello (registered) since the last
        call. One round trip as a rule: the streams of the nodes known at the last call are
        read with the node list, the hello stream and the deletion of what the last call
        handed out (:meth:`done_node_reports`: once applied); a node seen for the first time
        costs a second."""
        pipe = self.redis.pipeline(transaction=False)
        for node_id, done in self._reports_done.items():
            pipe.xdel(self._k_reports(node_id), *done)
        pipe.zrange(self._k_nodes, 0, -1)
        pipe.xrange(self._k_hello, count=limit)
        known = list(self._report_nodes)
        for node_id in known:
            pipe.xrange(self._k_reports(node_id), count=limit)
        replies = pipe.execute()[len(self._reports_done):]
        self._reports_done = {}
        members, hello, got = replies[0], replies[1], replies[2:]
        ids = list(dict.fromkeys([_str(m) for m in members] +
                                 [_str(f.get(b"n", b"")) for _, f in hello]))
        ids = [i for i in ids if i]
        read = dict(zip(known, got))
        new = [i for i in ids if i not in read]
        pipe = self.redis.pipeline(transaction=False)
        for node_id in new:
            pipe.xrange(self._k_reports(node_id), count=limit)
        if hello:
            pipe.xdel(self._k_hello, *[e for e, _ in hello])
        if new or hello:
            read.update(zip(new, pipe.execute()))
        self._report_nodes = ids
        return [(node_id, [(_str(e), f) for e, f in read[node_id]])
                for node_id in ids if read.get(node_id)]

    def done_node_reports(self, node_id: str, entry_ids: Sequence[str]) -> None:
        """Delete reports once applied: with the next call's reads (a leader that dies
        before leaves them to the next, which applies them again, harmlessly)."""
        if entry_ids:
            self._reports_done.setdefault(node_id, []).extend(entry_ids)

    def _ack_node(self, node_id: str, incarnation: str) -> bool:
        return bool(self._ack_script([self._k_node(node_id), self._k_nodes, self._k_node_seq],
                                     [node_id, incarnation]))

    def _forget_node(self, node_id: str, incarnation: str) -> bool:
        keys = [self._k_node(node_id), self._k_nodes, self._k_alloc(node_id),
                self._k_view(node_id), self._k_reports(node_id)]
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
                k: json.dumps(r.to_list()) for k, r in set_.items()
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
        return [None if r is None else Reason.from_list(json.loads(r)) for r in raw]

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

    def _put_cycle_failure(self, at: float, error: str, keep: int) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.lpush(self._k_failures, json.dumps([at, error]))
        pipe.ltrim(self._k_failures, 0, keep - 1)
        pipe.execute()

    def _get_cycle_failures(self) -> list[tuple[float, str]]:
        return [(float(at), str(error)) for at, error in
                (json.loads(r) for r in self.redis.lrange(self._k_failures, 0, -1))]

    # -- cloud instances -----------------------------------------------------------------------


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

    def _put_boot(self, offer_id: str, raw: str) -> None:
        self.redis.hset(f"{self.prefix}boots", offer_id, raw)

    def _load_boots(self) -> dict[str, str]:
        return {_str(k): _str(v) for k, v in self.redis.hgetall(f"{self.prefix}boots").items()}

    def _load_blocks(self) -> list[Block]:
        from broker.store.instances import Block

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
                    now: float, node_id: str = "") -> None:
        if not node_id:  # (a caller that is no agent: the node of the job's first part)
            job = self._load([job_id])[0]
            node_id = job.allocations[0].node_id if job is not None and job.allocations \
                else ""
        try:
            append_logs(self._append_script, self.prefix, node_id, job_id, attempt, lines,
                        now)
        except StaleAttempt:  # (say what the job is at: the store may read its record)
            job = self._load([job_id])[0]
            raise StaleAttempt(job_id, attempt, job.attempt if job else 0,
                               job.state.value if job else "MISSING") from None

    def read_logs(self, job_id: str, attempt: int, cursor: str = "0", limit: int = 1000,
                  block_s: float = 0.0) -> list[LogLine]:
        """The attempt's lines after ``cursor``, from the log stream of each node it ran on
        (one for most jobs; a gang's are merged by time, and then the cursor holds a position
        per node: ``<node>=<entry id>`` joined by ``,``). As in MemoryStore, "", "0" and "$"
        all mean "from the first line"."""
        if limit <= 0:
            return []
        nodes = self._log_nodes(job_id, attempt)
        if not nodes:  # (not placed yet: nothing to read; a blocking read waits all the same)
            if block_s > 0:
                time.sleep(block_s)
            return []
        at = _cursor_positions(cursor, nodes)
        block = max(1, int(block_s * 1000)) if block_s > 0 else None
        keys = {self._k_logs(job_id, attempt, n): n for n in nodes}
        reply = self.redis.xread({k: at[n] for k, n in keys.items()}, count=limit,
                                 block=block)
        if not reply:
            return []
        if isinstance(reply, dict):  # RESP3: {key: [[entry, ...]]}
            streams = [(_str(k), entries) for k, v in reply.items() for entries in v]
        else:  # RESP2: [[key, [entry, ...]]]
            streams = [(_str(k), entries) for k, entries in reply]
        rows: list[tuple[float, str, str, str, str]] = []
        for key, entries in streams:
            for entry in entries:
                entry_id, fields = entry[0], entry[1]  # type: ignore[index]
                f = {_str(k): v for k, v in fields.items()}  # type: ignore[union-attr]
                rows.append((float(_str(f["t"])), keys[key], _str(entry_id), _str(f["s"]),
                             _str(f["x"])))
        if len(nodes) > 1:
            rows.sort(key=lambda r: r[0])  # (stable: one node's lines keep their order)
        out = []
        for t, node, entry_id, stream, text in rows[:limit]:
            at[node] = entry_id
            pos = entry_id if len(nodes) == 1 else ",".join(f"{n}={at[n]}" for n in nodes)
            out.append(LogLine(pos, t, stream, text))
        return out

    def _log_nodes(self, job_id: str, attempt: int) -> list[str]:
        """The nodes attempt ``attempt`` of the job ran (or runs) on, in rank order."""
        job = self._load([job_id])[0] or self._load_archived(job_id)
        if job is None:
            return []
        allocs = job.allocations if job.attempt == attempt and job.allocations else next(
            (a.allocations for a in job.attempts if a.number == attempt), ())
        return list(dict.fromkeys(a.node_id for a in sorted(allocs, key=lambda a: a.rank)))


def _cursor_positions(cursor: str, nodes: Sequence[str]) -> dict[str, str]:
    """Each node's stream position in a cursor ("", "0", "$": from the first line; an entry
    id, for one node; ``node=id,...`` for several)."""
    at = dict.fromkeys(nodes, "0")
    if cursor in ("", "0", "$"):
        return at
    if "=" not in cursor:
        at[nodes[0]] = cursor
        return at
    for item in cursor.split(","):
        node, _, pos = item.partition("=")
        if node in at and pos:
            at[node] = pos
    return at


def append_logs(script: Any, prefix: str, node_id: str, job_id: str, attempt: int,
                lines: Sequence[tuple[str, str]], now: float, client: Any = None) -> None:
    """Append lines to node ``node_id``'s log stream of the attempt while the node's view
    holds that attempt (broker/store/lua.py APPEND_LOGS: an agent's own call, with its
    ``client``, and the store's); StaleAttempt otherwise."""
    args: list[Any] = [attempt, repr(float(now)), LOG_MAXLEN, LOG_TTL_S, job_id]
    for stream, text in lines:
        args += [stream, text]
    k = NodeKeys(prefix, node_id)
    keys = [k.view, k.logs(job_id, attempt)]
    res = script(keys, args, client=client)
    if int(res[0]) != 1:
        raise StaleAttempt(job_id, attempt, int(_str(res[1])), _str(res[2]))
