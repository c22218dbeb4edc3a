"""Spot interruption notices: a thread of the agent that polls the cloud's metadata service and,
on a notice, drains the node so its jobs checkpoint and go back to the queue.

- **AWS** (IMDSv2): ``PUT /latest/api/token`` for a session token, then
  ``GET /latest/meta-data/spot/instance-action`` with it. 404 means no notice; 200 carries
  ``{"action": "terminate"|"stop"|"hibernate", "time": "2026-12-05T04:00:00Z"}``, about two
  minutes before EC2 takes the machine back.
- **GCP**: ``GET /computeMetadata/v1/instance/preempted`` with ``Metadata-Flavor: Google``
  answers ``TRUE`` once the machine is preempted (about 30 seconds before it stops).

The metadata base URL is the cloud's own (``http://169.254.169.254``,
``http://metadata.google.internal``) unless ``$SPILLWAY_METADATA_URL`` names another (tests run
a fake). ``$SPILLWAY_SPOT_WATCH`` chooses the watcher: ``auto`` (default: on spot sites of
``aws``/``gcp`` providers), ``aws``, ``gcp`` or ``off``; ``$SPILLWAY_SPOT_POLL_S`` the poll
period (default 5 s, what AWS advises).

On a notice the agent (:func:`act_on_notice`): marks its instance record DRAINING and cools
the offer's zone down (the reconciler sees the machine terminated and ends the record), then
drains with eviction kind ``spot``: every job gets SIGTERM and the grace period to checkpoint,
and goes back to the queue with its attempt raised (``SPILLWAY_RESUME=1`` on the next start).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from broker.model import Node, Site
from broker.model.state import EvictionKind
from broker.store.node_reports import Noticed, Report

log = logging.getLogger(__name__)

METADATA_ENV = "SPILLWAY_METADATA_URL"  # the same variable the boot script reads
WATCH_ENV = "SPILLWAY_SPOT_WATCH"
POLL_ENV = "SPILLWAY_SPOT_POLL_S"
WATCH_CHOICES = ("auto", "aws", "gcp", "off")
AWS_METADATA = "http://169.254.169.254"
GCP_METADATA = "http://metadata.google.internal"
GCP_NOTICE_S = 30.0  # a preempted GCE machine gets about this long


@dataclass(frozen=True)
class Notice:
    """The cloud is taking this machine back."""

    cloud: str  # aws or gcp
    action: str  # aws: terminate, stop or hibernate; gcp: preempted
    deadline: float | None  # epoch seconds when the machine goes; None if not said
    detail: str = ""  # the metadata service's answer

    def describe(self, now: float) -> str:
        left = "" if self.deadline is None else f", {max(0.0, self.deadline - now):.0f}s left"
        return f"{self.cloud} spot interruption notice ({self.action}{left})"


class MetadataError(Exception):
    """The metadata service did not answer as expected."""


class NoticeSource(Protocol):
    cloud: str

    def check(self, now: float) -> Notice | None: ...


def _request(url: str, timeout_s: float, headers: Mapping[str, str],
             method: str = "GET") -> tuple[int, str]:
    """(status, body); 404 and other HTTP errors are returned, not raised."""
    req = urllib.request.Request(url, method=method, headers=dict(headers))
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as e:
        raise MetadataError(f"{url}: {getattr(e, 'reason', e)}") from None


class AwsNotices:
    """EC2's spot instance-action, read with an IMDSv2 session token (renewed before it
    expires, and at once when the service refuses it)."""

    cloud = "aws"
    TOKEN_TTL_S = 21600

    def __init__(self, base_url: str = AWS_METADATA, timeout_s: float = 2.0) -> None:
        self.base, self.timeout_s = base_url.rstrip("/"), timeout_s
        self._token, self._token_until = "", 0.0

    def _session_token(self, now: float) -> str:
        if not self._token or now >= self._token_until:
            status, body = _request(f"{self.base}/latest/api/token", self.timeout_s,
                                    {"X-aws-ec2-metadata-token-ttl-seconds":
                                     str(self.TOKEN_TTL_S)}, method="PUT")
            if status != 200 or not body:
                raise MetadataError(f"{self.base}/latest/api/token answered {status}")
            self._token, self._token_until = body.strip(), now + self.TOKEN_TTL_S * 0.9
        return self._token

    def check(self, now: float) -> Notice | None:
        url = f"{self.base}/latest/meta-data/spot/instance-action"
        for _ in range(2):
            status, body = _request(url, self.timeout_s,
                                    {"X-aws-ec2-metadata-token": self._session_token(now)})
            if status == 401:  # the token expired or the service restarted: a new one
                self._token = ""
                continue
            if status == 404:
                return None
            if status != 200:
                raise MetadataError(f"{url} answered {status}")
            return _aws_notice(body)
        raise MetadataError(f"{url} refused a fresh IMDSv2 token (401)")


def _aws_notice(body: str) -> Notice:
    try:
        doc = json.loads(body)
        action = str(doc.get("action", "terminate"))
        when = dt.datetime.fromisoformat(str(doc["time"]).replace("Z", "+00:00"))
        return Notice("aws", action, when.timestamp(), body.strip())
    except (ValueError, KeyError, TypeError, AttributeError):
        return Notice("aws", "terminate", None, body.strip())  # a notice all the same


class GcpNotices:
    """GCE's ``instance/preempted`` flag."""

    cloud = "gcp"

    def __init__(self, base_url: str = GCP_METADATA, timeout_s: float = 2.0) -> None:
        self.base, self.timeout_s = base_url.rstrip("/"), timeout_s

    def check(self, now: float) -> Notice | None:
        url = f"{self.base}/computeMetadata/v1/instance/preempted"
        status, body = _request(url, self.timeout_s, {"Metadata-Flavor": "Google"})
        if status != 200:
            raise MetadataError(f"{url} answered {status}")
        if body.strip().upper() != "TRUE":
            return None
        return Notice("gcp", "preempted", now + GCP_NOTICE_S, body.strip())


def source_for(site: Site, watch: str = "auto", base_url: str | None = None
               ) -> NoticeSource | None:
    """The notice source for a node at ``site``: ``auto`` watches spot sites of providers
    named aws or gcp (``aws-prod`` counts as aws); ``aws``/``gcp`` force one; ``off``:
    none. ValueError names the setting when ``watch`` is none of these."""
    if watch not in WATCH_CHOICES:
        raise ValueError(f"{WATCH_ENV}: {watch!r} is not one of {', '.join(WATCH_CHOICES)}")
    cloud = watch
    if watch == "auto":
        if not site.is_spot:
            return None
        cloud = next((c for c in ("aws", "gcp")
                      if site.provider == c or site.provider.startswith(f"{c}-")), "off")
    if cloud == "aws":
        return AwsNotices(base_url or AWS_METADATA)
    if cloud == "gcp":
        return GcpNotices(base_url or GCP_METADATA)
    return None


class Watcher:
    """Polls a notice source every ``interval_s`` on its own thread; calls ``on_notice``
    once, on the first notice, and stops polling."""

    def __init__(self, source: NoticeSource, on_notice: Callable[[Notice], object],
                 interval_s: float = 5.0, clock: Callable[[], float] = time.time) -> None:
        self.source, self.on_notice = source, on_notice
        self.interval_s, self.clock = interval_s, clock
        self.notice: Notice | None = None
        self.fired = threading.Event()  # set once on_notice has returned
        self._quit = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="spillway-spot-watch",
                                        daemon=True)

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._quit.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def _loop(self) -> None:
        warned_at = -1e18
        while not self._quit.is_set():
            now = self.clock()
            try:
                notice = self.source.check(now)
            except MetadataError as e:
                if now - warned_at >= 60.0:  # one line a minute while it does not answer
                    log.warning("spot notices: the metadata service does not answer (%s); "
                                "still polling every %.0fs", e, self.interval_s)
                    warned_at = now
                notice = None
            if notice is not None:
                self.notice = notice
                log.warning("%s", notice.describe(now))
                try:
                    self.on_notice(notice)
                except Exception:
                    log.exception("acting on the spot notice failed")
                self.fired.set()
                return
            self._quit.wait(self.interval_s)


# ---------------------------------------------------------------------------------------------
# What the agent does on a notice


class DrainableAgent(Protocol):
    channel: Any  # workers/channel.py NodeChannel: its node's reports
    node: Node
    config: Any

    def drain(self, timeout: float | None = None, kind: EvictionKind = ...,
              reason: str | None = None) -> bool: ...


def act_on_notice(agent: DrainableAgent, notice: Notice, now: float) -> bool:
    """Report the notice (the scheduler marks the node's instance DRAINING and cools its
    zone down: broker/store/node_reports.py), then drain the node with eviction kind
    ``spot``. True when every job ended within the grace period."""
    reason = notice.describe(now)
    try:
        agent.channel.report_many([Report("", 0, Noticed(reason), now)])
    except Exception:
        log.exception("could not report the spot notice on instance %s (draining anyway)",
                      agent.node.instance_id)
    return agent.drain(kind=EvictionKind.SPOT, reason=f"Node {agent.node.id}: {reason}")


def make_watcher(agent: DrainableAgent, environ: Mapping[str, str] = os.environ,
                 clock: Callable[[], float] = time.time) -> Watcher | None:
    """The agent's watcher (not started yet), per the environment (module docstring); None if
    this node needs none. ValueError names a bad variable and what it may be."""
    source = source_for(Site.parse(agent.node.site), environ.get(WATCH_ENV, "auto").lower(),
                        environ.get(METADATA_ENV) or None)
    raw = environ.get(POLL_ENV, "5")
    try:
        interval = float(raw)
        if not 0 < interval < float("inf"):
            raise ValueError
    except ValueError:
        raise ValueError(f"{POLL_ENV}: {raw!r} must be seconds > 0") from None
    if source is None:
        return None
    log.info("watching for %s spot interruption notices every %.1fs", source.cloud, interval)
    return Watcher(source, lambda n: act_on_notice(agent, n, clock()), interval, clock)
