"""One device rule of a job's cgroup fence: which device numbers it may open, and how.

:mod:`workers.devices` makes a part's rules; :mod:`workers.isolation` writes them to a v1
``devices`` cgroup (:meth:`Rule.v1`) or attaches them as a v2 device program
(:mod:`workers.devbpf` compiles them). Both import the rule from here.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ACCESS", "Rule"]

ACCESS = "rwm"  # read, write, mknod


@dataclass(frozen=True)
class Rule:
    """Allow ``access`` (of ``rwm``) to the ``kind`` (``c`` or ``b``) device ``major:minor``;
    ``minor`` None: any minor of that major."""

    kind: str
    major: int
    minor: int | None
    access: str = ACCESS

    def __post_init__(self) -> None:
        if self.kind not in ("c", "b"):
            raise ValueError(f"device kind {self.kind!r}: c or b")
        if not 0 <= self.major < 2**12 or not (self.minor is None or 0 <= self.minor < 2**20):
            raise ValueError(f"device {self.major}:{self.minor} out of range")
        if not self.access or set(self.access) - set(ACCESS):
            raise ValueError(f"device access {self.access!r}: letters of {ACCESS}")

    def v1(self) -> str:
        """As the v1 ``devices.allow`` file takes it: ``c 195:0 rwm``."""
        minor = "*" if self.minor is None else str(self.minor)
        return f"{self.kind} {self.major}:{minor} {self.access}"
