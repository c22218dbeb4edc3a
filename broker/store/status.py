"""What a backend's compare-and-set commit answers for each Change, and shared limits."""

from __future__ import annotations

OK, VERSION, BUSY, DEAD, FENCED = "ok", "version", "busy", "dead", "fenced"
CHANGED = "changed"  # the stored document is not the one the Change was computed from
RETRIES = 20  # compare-and-set attempts before Conflict
# _add_usage's arguments: team, GPU-seconds, time, half-life, runtime sample or None
Usage = tuple[str, float, float, float, tuple[str, str, int, float, float] | None]
