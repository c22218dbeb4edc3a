"""The Redis store's records beside the jobs and the logs: nodes and their allocations,
pending reasons, fair-share usage and runtime samples, the reservation and the queue order,
cloud instances, offers and blocks, and leadership, in the layout of :mod:`broker.store.redis`
(its keys and scripts: :mod:`broker.store.redis_base`; the logs: :mod:`broker.store.redis_logs`).
:class:`broker.store.redis.RedisStore` adds the jobs (their documents, indexes, snapshot reads
and compare-and-set writes) on top.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from broker.model import Instance, Node, NodeState, Reason
from broker.store.backend import ORDER_CAP, Block, QueueOrder
from broker.store.redis_keys import NODE_FIELDS, _str
from broker.store.redis_logs import RedisLogs

RUNTIME_SAMPLES = 50_000  # finished runtimes kept for the predictor


class RedisRecords(RedisLogs):
    """Everything of the Redis store but the jobs (abstract: see :class:`RedisStore`)."""

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
