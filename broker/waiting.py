"""Waiting without sleeping blindly: poll a condition with a deadline; process liveness."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll_until(pred: Callable[[], T], timeout: float, what: str, every: float = 0.02,
               error: type[Exception] = TimeoutError) -> T:
    """Call ``pred`` until it returns something truthy and return that; raise ``error``
    naming ``what`` once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise error(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
