"""The Redis store's log streams: each node an attempt runs on writes its own stream
(broker/store/redis_keys.py), and a read merges them by time behind one cursor.
:class:`RedisLogs` is the part of :class:`broker.store.redis.RedisStore` that serves them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from broker.errors import StaleAttempt
from broker.store.backend import LogLine
from broker.store.redis_base import RedisBase
from broker.store.redis_keys import NodeKeys, _cursor_positions, _str, append_logs


class RedisLogs(RedisBase):
    """Appending to and reading the attempts' log streams (abstract: see
    :class:`~broker.store.redis.RedisStore`)."""

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
        keys = {NodeKeys(self.prefix, n).logs(job_id, attempt): n for n in nodes}
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
