"""The one interface between :class:`broker.client.Client` and a cluster: the operations a
client performs, carried either to the cluster's Redis (:mod:`broker.client.local`) or to an
API server over HTTPS (:mod:`broker.client.https`). The Client picks one when it is made and
calls it for every operation; it holds no branch per method.

Input reaches a transport as the caller gave it (a spec or a mapping and its keyword fields):
the Redis transport checks it against the configuration here, the API server checks it there.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol

from broker.client.views import Explanation, NodeView
from broker.model import Job, JobSpec, Node
from broker.model.state import JobState
from broker.store.backend import LogLine

__all__ = ["SpecInput", "Transport"]

#: What submit takes: a JobSpec, a mapping of its fields, or None (the keyword fields alone).
SpecInput = JobSpec | Mapping[str, Any] | None


class Transport(Protocol):
    """A cluster's operations, as a client calls them (see :class:`broker.client.Client` for
    what each one does)."""

    def acting_as(self, actor: str) -> Transport:
        """This transport (same connections) acting for ``actor``."""
        ...

    def close(self) -> None:
        """Close its connections (safe to call twice)."""
        ...

    def submit(self, spec: SpecInput, fields: Mapping[str, Any], hold: bool | None) -> Job: ...

    def submit_many(self, specs: Iterable[JobSpec | Mapping[str, Any]], hold: bool | None
                    ) -> builtins.list[Job]: ...

    def get(self, job_id: str) -> Job: ...

    def list(self, states: set[JobState] | None, team: str | None, priority: str | None,
             limit: int | None, skip: int) -> builtins.list[Job]: ...

    def cancel(self, job_id: str) -> Job: ...

    def wait(self, job_id: str, timeout: float | None, poll_s: float) -> Job:
        """The job once it ended; JobTimeout (broker.client.views) when ``timeout`` passed."""
        ...

    def logs(self, job_id: str, attempt: int | None, follow: bool,
             since: str) -> Iterator[LogLine]: ...

    def explain(self, job_id: str) -> Explanation: ...

    def drain(self, node_id: str) -> Node: ...

    def resume(self, node_id: str) -> Node: ...

    def forget_node(self, node_id: str, force: bool) -> builtins.list[Job]: ...

    def nodes(self) -> builtins.list[NodeView]: ...
