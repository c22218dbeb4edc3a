"""The client's HTTPS transport: a cluster's operations sent to an API server (``spillway
api``) with a token, through :class:`broker.api.remote.Remote` (the requests themselves, the
token, TLS and the kept connection). The server checks each spec and each caller's rights;
this side sends the caller's fields as given, a workdir taken against the submit directory.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from broker.api.remote import Remote
from broker.client.inputs import merged, workdir_of
from broker.client.transport import SpecInput
from broker.client.views import Explanation, JobTimeout, NodeView
from broker.config.core import Config
from broker.errors import SpillwayError
from broker.model import Job, JobSpec, Node
from broker.model.state import JobState
from broker.store.backend import LogLine

__all__ = ["HttpsTransport"]


class HttpsTransport:
    """One API server (``https://``, or ``http://`` to this machine)."""

    def __init__(self, config: Config, url: str) -> None:
        self.config, self.url = config, url
        self.remote = Remote(url, config)

    def acting_as(self, actor: str) -> HttpsTransport:
        return self  # (the server names its caller, the token's holder)

    def close(self) -> None:
        self.remote.close()

    def submit(self, spec: SpecInput, fields: Mapping[str, Any], hold: bool | None) -> Job:
        return self.remote.submit(workdir_of(merged(spec, fields)), hold)

    def submit_many(self, specs: Iterable[JobSpec | Mapping[str, Any]], hold: bool | None
                    ) -> builtins.list[Job]:
        return self.remote.submit_many([workdir_of(merged(s, {})) for s in specs], hold)

    def get(self, job_id: str) -> Job:
        return self.remote.get(job_id)

    def list(self, states: set[JobState] | None, team: str | None, priority: str | None,
             limit: int | None, skip: int) -> builtins.list[Job]:
        return self.remote.list(states, team, priority, limit, skip)

    def cancel(self, job_id: str) -> Job:
        return self.remote.cancel(job_id)

    def wait(self, job_id: str, timeout: float | None, poll_s: float) -> Job:
        job, done = self.remote.wait(job_id, timeout)  # (the server's long poll: no polling)
        if not done:
            raise JobTimeout(job, timeout or 0.0)
        return job

    def logs(self, job_id: str, attempt: int | None, follow: bool,
             since: str) -> Iterator[LogLine]:
        return self.remote.logs(job_id, attempt, follow, since)

    def explain(self, job_id: str) -> Explanation:
        return Explanation.from_dict(self.remote.explain(job_id))

    def drain(self, node_id: str) -> Node:
        return self.remote.node_state(node_id, "drain")

    def resume(self, node_id: str) -> Node:
        return self.remote.node_state(node_id, "resume")

    def forget_node(self, node_id: str, force: bool) -> builtins.list[Job]:
        raise SpillwayError("forgetting a node needs the cluster's Redis (an operator's "
                            "--redis-url), not the HTTPS API")

    def nodes(self) -> builtins.list[NodeView]:
        return [NodeView.from_dict(d) for d in self.remote.nodes()]
