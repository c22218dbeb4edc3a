"""The Celery app. Messages carry commands (ids), never state; JSON only.

Queues: ``node.<id>`` (start/stop commands for one worker agent), ``provision`` (cloud
launches and terminations; nothing consumes it yet). :mod:`broker.bus.commands` sends every
message, by name; a process registers only the tasks of the queues it consumes
(:mod:`workers.tasks` for ``node.<id>``), so the app includes no task module. The scheduling
cycle and the reconciler are not Celery tasks: the leading scheduler runs them
(broker/control/leader.py), woken through Redis.
"""

from __future__ import annotations

import os

from celery import Celery

from broker.config.core import Config

CONTROL_QUEUE = "control"  # the default queue: nothing is sent there by design
PROVISION_QUEUE = "provision"


def node_queue(node_id: str) -> str:
    return f"node.{node_id}"


app = Celery("spillway")


def configure(celery: Celery, redis_url: str, config: Config | None = None) -> Celery:
    """Point ``celery`` at ``redis_url`` with Spillway's settings."""
    config = config or Config()
    previous = celery.conf.broker_url
    celery.conf.update(
        broker_url=redis_url,
        result_backend=None,
        task_ignore_result=True,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        worker_prefetch_multiplier=1,
        task_default_queue=CONTROL_QUEUE,
        # Longer than any task; commands are idempotent so a redelivery is harmless.
        broker_transport_options={"visibility_timeout": 12 * 3600},
        broker_connection_retry_on_startup=True,
        worker_send_task_events=False,
        worker_hijack_root_logger=False,
        timezone="UTC",
    )
    if previous and previous != redis_url:
        # Celery caches its connection and producer pools on first use; a process that talks
        # to a second cluster (tests, tools) must not keep publishing to the first one.
        celery._pool = None
        amqp = celery.__dict__.get("amqp")
        if amqp is not None:
            amqp._producer_pool = None
    return celery


# Tools that import the app (``celery -A broker.bus.app inspect ...``) find it configured when
# SPILLWAY_REDIS_URL is set.
if os.environ.get("SPILLWAY_REDIS_URL"):
    configure(app, os.environ["SPILLWAY_REDIS_URL"])
