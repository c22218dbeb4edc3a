"""The :class:`Client`: a connection to one Spillway cluster, through one transport chosen when
it is made (:mod:`broker.client.transport`): the cluster's Redis for a ``redis://`` URL
(:mod:`broker.client.local`), an API server for an ``https://`` one (:mod:`broker.client.https`).
Each method checks and shapes its arguments, then calls the transport.
"""

from __future__ import annotations

import builtins
import copy
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from broker.client.inputs import StateFilter, parse_states, resolve_url
from broker.client.local import RedisTransport
from broker.client.transport import Transport
from broker.client.views import Explanation, NodeView
from broker.config.core import Config, load_config
from broker.errors import ConfigError
from broker.model import Job, JobSpec, Node
from broker.store.backend import LogLine
from broker.store.base import BaseStore

if TYPE_CHECKING:  # (Celery and Redis's client are imported when first used: `spillway
    import redis  # queue` needs neither Celery nor the submit-time checks)
    from celery import Celery

    from broker.bus.runtime import Runtime

__all__ = ["Client"]


def _transport(config: Config, url: str) -> Transport:
    """The transport for ``url``: an API server's (http:// or https://), or Redis's."""
    if url.startswith(("http://", "https://")):
        from broker.client.https import HttpsTransport

        return HttpsTransport(config, url)
    return RedisTransport(config, url)


class Client:
    """A connection to one Spillway cluster: its Redis (``redis://``), or an API server
    (``https://``, with a token: broker/api/remote.py carries the calls)."""

    def __init__(self, redis_url: str | None = None, config: Config | None = None) -> None:
        self.config = config or load_config()
        self.redis_url = resolve_url(redis_url, self.config)
        self.actor: str | None = None  # who acts, for the job history (set by acting_as)
        self._transport = _transport(self.config, self.redis_url)
        # the API server's calls beyond the transport's (tokens, budgets, reports), or None
        self._remote: Any = getattr(self._transport, "remote", None)

    @property
    def transport(self) -> Transport:
        """What carries this client's calls (chosen by its URL when it was made)."""
        return self._transport

    def acting_as(self, actor: str) -> Client:
        """This client (same connections) acting for ``actor``, who is named in the history
        of what it submits, cancels and drains; submitted workdirs are taken as given (an API
        server's directory is not its caller's)."""
        other = copy.copy(self)
        other.actor = actor
        other._transport = self._transport.acting_as(actor)
        return other

    def _direct(self) -> RedisTransport:
        if not isinstance(self._transport, RedisTransport):
            raise ConfigError(f"{self.redis_url} is an API server: this needs a redis:// URL "
                              "(operators' direct access to the store)")
        return self._transport

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def store(self) -> BaseStore:
        """The cluster's store; an unreachable Redis raises StoreUnreachable."""
        return self._direct().store

    @property
    def store_redis(self) -> redis.Redis:
        """A plain Redis client on the cluster's database (for tools and benchmarks); an
        unreachable Redis raises StoreUnreachable."""
        return self._direct().store_redis

    @property
    def celery(self) -> Celery:
        """The Celery app, configured for this cluster."""
        return self._direct().celery

    @property
    def _rt(self) -> Runtime:
        """The cluster's per-process wiring (a Redis URL's only: tests run cycles on it)."""
        return self._direct().rt

    def close(self) -> None:
        """Close this client's connections (safe to call twice)."""
        self._transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- jobs ------------------------------------------------------------------------------------

    def submit(self, spec: JobSpec | Mapping[str, Any] | None = None, *,
               hold_if_infeasible: bool | None = None, **fields: Any) -> Job:
        """Validate and queue one job; returns it PENDING. SpecError stores nothing, also when
        no registered node could ever hold the job (unless ``hold_if_infeasible``)."""
        return self._transport.submit(spec, fields, hold_if_infeasible)

    def submit_many(self, specs: Iterable[JobSpec | Mapping[str, Any]], *,
                    hold_if_infeasible: bool | None = None) -> builtins.list[Job]:
        """Validate every spec, then queue them all in one write, or none of them."""
        return self._transport.submit_many(specs, hold_if_infeasible)

    def get(self, job_id: str) -> Job:
        """The job's current record; JobNotFound if there is none."""
        return self._transport.get(job_id)

    def list(self, state: StateFilter = None, team: str | None = None,
             priority: str | None = None, limit: int | None = None,
             skip: int = 0) -> builtins.list[Job]:
        """Jobs oldest first; ``limit`` keeps the newest N, after skipping the newest ``skip``
        (pages back). Jobs finished more than ``retain_finished_s`` ago are not listed;
        :meth:`get` still reads them."""
        return self._transport.list(parse_states(state), team, priority, limit, skip)

    def cancel(self, job_id: str) -> Job:
        """Cancel a job: a queued one ends at once, a placed one is stopped (SIGTERM, grace,
        SIGKILL). Cancelling a finished job changes nothing and returns it."""
        return self._transport.cancel(job_id)

    def wait(self, job_id: str, timeout: float | None = None, poll_s: float = 0.2) -> Job:
        """Block until the job is SUCCEEDED, FAILED or CANCELLED; JobTimeout otherwise."""
        return self._transport.wait(job_id, timeout, poll_s)

    def logs(self, job_id: str, attempt: int | None = None, follow: bool = False,
             since: str = "0") -> Iterator[LogLine]:
        """An attempt's output lines (default: the current attempt). With ``follow``, keep
        reading until the job ends or moves to a later attempt, and the stream is drained."""
        yield from self._transport.logs(job_id, attempt, follow, since)

    # -- why -------------------------------------------------------------------------------------

    def explain(self, job_id: str) -> Explanation:
        """Why the job is in its state: its class and SLA, how long it waited, the scheduler's
        reason and its place in the queue (both as the last cycle recorded them in the store),
        and how it ended if it did. Reads the store only; nothing is recomputed here."""
        return self._transport.explain(job_id)

    # -- nodes -----------------------------------------------------------------------------------

    def drain(self, node_id: str) -> Node:
        """Take no new jobs on a node; what runs there runs to its end. NodeNotFound if none."""
        return self._transport.drain(node_id)

    def resume(self, node_id: str) -> Node:
        """Let a drained node take jobs again, and schedule at once."""
        return self._transport.resume(node_id)

    def forget_node(self, node_id: str, force: bool = False) -> builtins.list[Job]:
        """Remove a dead node from the store (its record, and from every submit-time check):
        NodeNotFound for an unknown node; NodeBusy while its agent is alive, or while jobs are
        recorded on it unless ``force`` (they are requeued, and the jobs requeued returned)."""
        return self._transport.forget_node(node_id, force)

    def nodes(self) -> builtins.list[NodeView]:
        """Every registered node with its GPUs (total and free, by kind) and running jobs."""
        return self._transport.nodes()
