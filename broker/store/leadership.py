"""Leadership in the store: one scheduler leads, on a lease; its fencing token guards its
writes (broker/control/leader.py runs the election; the backends keep the lease)."""

from __future__ import annotations

import threading
import time
from abc import abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager


class Leadership:
    """The store's half of leader election (a mixin of :class:`~broker.store.base.BaseStore`).
    Backends implement the four primitives; a job write checks :meth:`fence_token`."""

    def __init__(self) -> None:
        self._fence = threading.local()  # the fencing token this thread writes under
        self._born = time.time()

    @abstractmethod
    def _acquire(self, owner: str, ttl_s: float, now: float) -> str | None: ...

    @abstractmethod
    def _renew(self, token: str, ttl_s: float, now: float) -> bool: ...

    @abstractmethod
    def _release(self, token: str) -> None: ...

    @abstractmethod
    def _leader(self, now: float) -> tuple[str, float] | None: ...

    def acquire_leadership(self, owner: str, ttl_s: float, now: float) -> str | None:
        """Lead the schedulers for ``ttl_s`` if no one does (an owner that leads already
        renews): the fencing token ``"<epoch>:<owner>"``, whose epoch grows with every new
        leadership, or None while another owner's lease runs."""
        return self._acquire(owner, ttl_s, now)

    def renew_leadership(self, token: str, ttl_s: float, now: float) -> bool:
        """Extend the lease of ``token``; False if that leadership has ended."""
        return self._renew(token, ttl_s, now)

    def release_leadership(self, token: str) -> None:
        """End the leadership of ``token`` now (a clean shutdown), if it still holds."""
        self._release(token)

    def leader(self, now: float) -> tuple[str, float] | None:
        """The leader's token and the seconds left on its lease, or None."""
        return self._leader(now)

    @contextmanager
    def fenced(self, token: str) -> Iterator[None]:
        """Writes of this thread inside the block are a leader's: each job write checks, in
        the same atomic step, that ``token`` still leads, and raises :class:`Fenced` if not
        (a paused or cut-off former leader cannot apply a stale plan)."""
        prev = getattr(self._fence, "token", None)
        self._fence.token = token
        try:
            yield
        finally:
            self._fence.token = prev

    def fence_token(self) -> str | None:
        """The fencing token this thread writes under, if any."""
        return getattr(self._fence, "token", None)

    def store_started_at(self, now: float) -> float:
        """When the store's server started (leases are judged from then at the earliest: a
        node is not declared dead for a silence the store itself caused)."""
        return self._born
