"""Which user a job runs as: a uid per team, never root and never the agent's.

An agent that runs as root runs every job as an unprivileged user of the job's team
(``job_isolation``, on by default):

* a team named in ``job_users`` runs as that user (a name or a uid of this host);
* otherwise, where ``job_user`` is set, as that one user (every such team shares it: the agent
  says so at start);
* otherwise as a uid allocated to the team from ``job_uid_range`` (default 61184-65519, the
  range systemd's ``DynamicUser`` uses), recorded in ``<work_dir>/uids.json`` so the team keeps
  it across jobs and restarts of this agent. A uid some account of this host already has is
  skipped. The group is the uid's number, and the job has no supplementary groups.

Each team gets a home directory ``<work_dir>/home/<uid>`` (mode 0700, its uid's), which is its
jobs' ``HOME``. Allocations are per host, like ``DynamicUser``: where jobs share files across
hosts (NFS checkpoints), name the teams' users in ``job_users`` so that every host agrees.

An agent that is not root cannot switch users: jobs run as the agent's uid, and
:func:`resolve` says what that means (``spillway status`` shows it; docs/security.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import hashlib
import json
import logging
import os
import pwd
import re
import stat
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from broker.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_RANGE = (61184, 65519)
_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")
MIN_UID = 1000  # below: system accounts
MAX_UID = 2**31 - 2  # (uid_t's largest, less the -1 "no uid")


@dataclass(frozen=True)
class JobIdentity:
    """Who a job's processes are: uid, gid, supplementary groups, and the names jobs see."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    name: str  # USER and LOGNAME
    home: str  # HOME: a directory the uid owns


def parse_range(text: str, where: str = "config job_uid_range") -> tuple[int, int]:
    """``"61184-65519"`` as (first, last); ConfigError naming the setting otherwise."""
    m = _RANGE.match(text or "")
    lo, hi = (int(m[1]), int(m[2])) if m else (0, -1)
    if not m or not MIN_UID <= lo <= hi <= MAX_UID:
        raise ConfigError(f"{where}: {text!r} is not allowed; use FIRST-LAST, two uids with "
                          f"{MIN_UID} <= FIRST <= LAST <= {MAX_UID}, e.g. 61184-65519")
    return lo, hi


def _account(user: str, where: str) -> pwd.struct_passwd:
    """The passwd entry of a user name or uid; ConfigError naming ``where`` if there is none."""
    try:
        return pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except KeyError:
        if user.isdigit():  # a bare uid with no account: allowed, with its own group
            return pwd.struct_passwd((f"uid-{user}", "x", int(user), int(user), "", "/", ""))
        raise ConfigError(f"{where}: {user!r} is no user on this host; allowed: an existing "
                          "unprivileged user name or a uid") from None


class JobUsers:
    """The user of each team's jobs on this host (an agent running as root)."""

    def __init__(self, work_dir: str, explicit: Mapping[str, str] | None = None,
                 shared: str = "", uid_range: str = "61184-65519",
                 agent_uid: int | None = None) -> None:
        self.work_dir = os.path.abspath(work_dir)
        self.agent_uid = os.geteuid() if agent_uid is None else agent_uid
        self.range = parse_range(uid_range)
        self._explicit = {team: self._checked(_account(str(u), f"config job_users.{team}"),
                                              f"config job_users.{team}")
                          for team, u in (explicit or {}).items()}
        self._shared = (self._checked(_account(shared, "config job_user"), "config job_user")
                        if shared else None)
        self._lock = threading.Lock()
        self._state = os.path.join(self.work_dir, "uids.json")
        self._cache: dict[str, JobIdentity] = {}

    def _checked(self, pw: pwd.struct_passwd, where: str) -> pwd.struct_passwd:
        if pw.pw_uid == 0 or pw.pw_gid == 0:
            raise ConfigError(f"{where}: {pw.pw_name!r} is root (uid or gid 0); jobs never run "
                              "as root: name an unprivileged user")
        if pw.pw_uid == self.agent_uid:
            raise ConfigError(f"{where}: {pw.pw_name!r} is the agent's own user; a job must "
                              "not be able to read the agent: name another user")
        return pw

    @property
    def shared_note(self) -> str:
        """A warning when teams share one user (``job_user``), else ""."""
        if self._shared is None:
            return ""
        return (f"job_user {self._shared.pw_name!r}: every team not named in job_users runs "
                "as this one user, so their jobs can read each other's processes and files; "
                "remove job_user to give each team a uid of its own")

    def for_team(self, team: str) -> JobIdentity:
        """The identity of ``team``'s jobs (allocating its uid on first use)."""
        hit = self._cache.get(team)
        if hit is not None:
            return hit
        pw = self._explicit.get(team) or self._shared
        if pw is not None:
            try:
                groups = tuple(g for g in os.getgrouplist(pw.pw_name, pw.pw_gid) if g != 0)
            except OSError:
                groups = (pw.pw_gid,)
            ident = self._identity(pw.pw_uid, pw.pw_gid, groups, pw.pw_name)
        else:
            uid = self._allocate(team)
            ident = self._identity(uid, uid, (), _name_of(uid, team))
        self._cache[team] = ident
        return ident

    def _identity(self, uid: int, gid: int, groups: tuple[int, ...], name: str
                  ) -> JobIdentity:
        home = os.path.join(self.work_dir, "home", str(uid))
        own_dir(home, uid, gid)
        return JobIdentity(uid, gid, groups, name, home)

    def _allocate(self, team: str) -> int:
        """The team's uid from ``uids.json`` (locked across agents of this host), or the
        lowest free one of the range."""
        os.makedirs(self.work_dir, exist_ok=True)
        with self._lock, open(self._state + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            table = _read_table(self._state)
            uid = table.get(team)
            if isinstance(uid, int) and self.range[0] <= uid <= self.range[1]:
                return uid
            taken = set(v for v in table.values() if isinstance(v, int))
            for candidate in range(self.range[0], self.range[1] + 1):
                if candidate in taken or candidate == self.agent_uid or _has_account(candidate):
                    continue
                table[team] = candidate
                _write_table(self._state, table)
                log.info("team %s runs its jobs as uid %d on this host", team, candidate)
                return candidate
        raise ConfigError(f"config job_uid_range: all {self.range[1] - self.range[0] + 1} uids "
                          f"of {self.range[0]}-{self.range[1]} are taken; team {team!r} has "
                          "none: widen the range or name the team's user in job_users")


def _name_of(uid: int, team: str) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", team)[:24]
        return f"spillway-{safe}"


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        pass
    try:
        grp.getgrgid(uid)
        return True
    except KeyError:
        return False


def _read_table(path: str) -> dict[str, int]:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return {str(k): v for k, v in data.items() if isinstance(v, int)} \
        if isinstance(data, dict) else {}


def _write_table(path: str, table: Mapping[str, int]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(dict(sorted(table.items())), f, indent=1)
    os.replace(tmp, path)


def own_dir(path: str, uid: int, gid: int, mode: int = 0o700) -> None:
    """``path`` exists, is a real directory (not a link) owned by ``uid:gid`` with ``mode``;
    OSError if it cannot be made so."""
    os.makedirs(path, mode=mode, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def traversable(path: str) -> str:
    """"" if every directory on the way to ``path`` lets other users pass (its ``x`` bit for
    others), else the first one that does not."""
    return blocked_at(path)


def blocked_at(path: str, uid: int | None = None, groups: frozenset[int] = frozenset()
               ) -> str:
    """The first directory on the way to ``path`` (``path`` included) that ``uid`` with
    ``groups`` may not pass (its ``x`` bit as Unix checks it: owner, group, others; no uid:
    any other user), or "" where it may pass them all. A directory not there yet is no
    obstacle."""
    parts = os.path.abspath(path).split(os.sep)
    for i in range(2, len(parts) + 1):
        d = os.sep.join(parts[:i]) or os.sep
        try:
            st = os.stat(d)
        except FileNotFoundError:
            continue
        bit = 0o100 if st.st_uid == uid else 0o010 if st.st_gid in groups else 0o001
        if not st.st_mode & bit:
            return d
    return ""


@dataclass(frozen=True)
class Isolating:
    """What the agent does about job users: ``users`` (None: jobs run as the agent's uid) and
    the one-line summary ``spillway status`` and the log show."""

    users: JobUsers | None
    summary: str
    short: str  # a few words for `spillway status` and `nodes`


def jobs_dir(work_dir: str, node_id: str) -> str:
    """Where the directories of jobs that run as per-team users go (their own working
    directories, checkpoints, scratch, homes): the agent's ``work_dir`` when other users may
    pass through every directory above it; otherwise (``~root/.local/state/...``: ``/root`` is
    0700) a directory of root's, mode 0711, under ``/var/tmp/spillway-root`` (checked to be
    root's and no link, so no job can have made it first), and the agent says so."""
    work_dir = os.path.abspath(work_dir)
    blocked = traversable(work_dir)
    if not blocked:
        return work_dir
    base = "/var/tmp/spillway-root"
    with contextlib.suppress(FileExistsError):
        os.mkdir(base, 0o711)
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise ConfigError(f"{base} is not a directory of root's that only root may write "
                          "(someone else made it): remove it, or give the worker a --work-dir "
                          "other users may pass through (e.g. /var/lib/spillway)")
    os.chmod(base, 0o711)
    tag = hashlib.sha256(work_dir.encode()).hexdigest()[:10]
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", node_id)[:64]
    out = os.path.join(base, f"{safe}-{tag}")
    os.makedirs(out, mode=0o711, exist_ok=True)
    log.warning("jobs run as per-team users, who cannot pass through %s: their directories "
                "(own working directory, checkpoints, scratch, home) go to %s instead; give the "
                "worker a --work-dir others may pass through (e.g. /var/lib/spillway) to keep "
                "them under it", blocked, out)
    return out


def resolve(work_dir: str, enabled: bool, explicit: Mapping[str, str], shared: str,
            uid_range: str) -> Isolating:
    """Decide, at agent start, which users jobs run as (``work_dir``: where the jobs'
    directories go, :func:`jobs_dir`); ConfigError for a bad setting."""
    if not enabled:
        return Isolating(None, "off (job_isolation false): jobs run as the agent's uid "
                               f"{os.geteuid()} and can read its files and each other's",
                         "off: jobs run as the agent's user")
    if os.geteuid() != 0:
        return Isolating(None, f"none: the agent is not root (uid {os.geteuid()}), so jobs run "
                               "as its uid; the agent is non-dumpable, but a job can read "
                               "files the agent's user can (its credentials file included) "
                               "and other jobs' processes and files: run the worker as root "
                               "for per-team users",
                         "none: agent not root, jobs run as its user")
    users = JobUsers(work_dir, explicit, shared, uid_range, agent_uid=0)
    lo, hi = users.range
    how = (f"per-team uids ({len(explicit)} named in job_users, the others from {lo}-{hi})"
           if not shared else f"job_users, else the shared job_user {shared!r}")
    return Isolating(users, f"jobs run as {how}, never root",
                     "uid per team" if not shared else "shared job_user")
