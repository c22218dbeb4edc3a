"""The values a JobSpec is made of, parsed and checked: durations, times, environment names,
texts a process can be given (broker/model/spec.py uses them; so do the CLI and the agent)."""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone
from typing import Annotated, Any

from pydantic import AfterValidator

from broker.errors import FieldError

#: The longest time limit by default (the configuration's ``max_time_limit_s``): 30 days.
MAX_TIME_LIMIT_S = 30 * 86400.0
#: The latest deadline: the end of year 9999 (what a timestamp can be shown as), UTC.
MAX_DEADLINE = 253402300799.0
_DUR_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(d|h|m|s)")
_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration(value: str | float | int) -> float:
    """``"6h"``, ``"1h30m"``, ``"90s"``, ``"2d"``, ``"HH:MM:SS"`` or seconds, as seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    if re.fullmatch(r"\d+:\d{2}(:\d{2})?", text):
        parts = [int(p) for p in text.split(":")]
        while len(parts) < 3:
            parts.append(0)
        return float(parts[0] * 3600 + parts[1] * 60 + parts[2])
    pos, total = 0, 0.0
    for m in _DUR_RE.finditer(text.replace(" ", "")):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos == 0 or pos != len(text.replace(" ", "")):
        raise ValueError(f"{value!r} is not a duration like 90s, 30m, 6h, 1h30m, 2d or HH:MM:SS")
    return total


def parse_time(value: str | float | int) -> float:
    """An ISO 8601 timestamp (UTC if no zone) or epoch seconds, as epoch seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    try:
        dt = datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{value!r} is not an ISO 8601 time or epoch seconds") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def _env_name(name: str) -> str:
    """An environment variable's name: not empty, no ``=`` nor NUL (execve could not pass it:
    the job would fail only on its node)."""
    if not name:
        raise ValueError("is empty")
    if "=" in name:
        raise ValueError("contains '='")
    if "\0" in name:
        raise ValueError("contains a NUL byte")
    return name


def no_nul(text: str) -> str:
    if "\0" in text:
        raise ValueError("contains a NUL byte, which no process's environment, argument or "
                         "path can hold")
    return text


EnvName = Annotated[str, AfterValidator(_env_name)]
NoNul = Annotated[str, AfterValidator(no_nul)]


def shown(value: Any) -> str:
    """A value for a message, cut to a readable length."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def seconds_text(secs: float) -> str:
    """Seconds for a message: ``2592000s (30 days)``."""
    text = f"{secs:.10g}s"
    return f"{text} ({secs / 86400:.8g} days)" if math.isfinite(secs) and secs >= 86400 \
        else text


def over_max(limit: float | None, most: float) -> list[FieldError]:
    """A time limit longer than the configuration's maximum (``most``), as the error naming
    it; none otherwise."""
    if limit is None or limit <= most:
        return []
    return [FieldError("time_limit", f"{seconds_text(limit)} is longer than the longest "
                                     f"allowed, {seconds_text(most)}",
                       f"a duration > 0 and at most {seconds_text(most)} (the configuration's "
                       "max_time_limit_s)")]
