"""The Redis store's key layout and what an agent writes with it: the keys of a node
(:class:`NodeKeys`: its record, allocations, view, report stream and log streams), the hello
stream, and the append to an attempt's log stream that an agent and the store both make
(broker/store/lua.py APPEND_LOGS). Shared by :mod:`broker.store.redis` and the agent's channel
(workers/channel.py), which loads no more of the store than this.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from broker.errors import StaleAttempt

LOG_MAXLEN = 100_000  # approximate cap (MAXLEN ~) on one attempt's log stream
LOG_TTL_S = 7 * 86400  # a log stream lives this long after its last line


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
