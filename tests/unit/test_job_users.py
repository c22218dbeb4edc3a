"""Which user a job runs as (workers/users.py), and the privilege drop before anything of the
spec is honoured (workers/runner.py): table tests of the rules, real processes for the drop."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
from pathlib import Path

import pytest

from broker.errors import ConfigError
from tests.unit.test_runner import Harness
from workers import users
from workers.runner import Supervisor
from workers.users import JobUsers, parse_range, resolve

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="only root runs jobs as other users")


@pytest.fixture
def top(passable_tmp: Path) -> Path:
    return passable_tmp


@pytest.mark.parametrize(("text", "ok"), [
    ("61184-65519", (61184, 65519)), (" 2000 - 2000 ", (2000, 2000)), ("999-2000", None),
    ("2000-1999", None), ("a-b", None), ("", None), ("5000", None), ("0-10", None),
    ("3000-9999999999", None)])
def test_uid_ranges(text: str, ok: tuple[int, int] | None) -> None:
    if ok is None:
        with pytest.raises(ConfigError, match="job_uid_range"):
            parse_range(text)
    else:
        assert parse_range(text) == ok


@ROOT_ONLY
def test_each_team_gets_a_uid_of_its_own_kept_across_restarts(top: Path) -> None:
    nobody = pwd.getpwnam("nobody").pw_uid  # (65534: a uid some account has is skipped)
    r = f"{nobody - 1}-{nobody + 1}"
    first = JobUsers(str(top), uid_range=r, agent_uid=0)
    a, b = first.for_team("vision"), first.for_team("nlp")
    assert (a.uid, b.uid) == (nobody - 1, nobody + 1)
    assert a.gid == a.uid and a.groups == () and a.name.startswith("spillway-")
    assert Path(a.home).stat().st_uid == a.uid and Path(a.home).stat().st_mode & 0o777 == 0o700
    again = JobUsers(str(top), uid_range=r, agent_uid=0)  # (a restarted agent)
    assert again.for_team("nlp").uid == b.uid and again.for_team("vision").uid == a.uid
    with pytest.raises(ConfigError, match=r"all 3 uids of .* are taken; team 'speech'"):
        again.for_team("speech")
    assert oct(os.stat(top / "uids.json").st_mode & 0o777) == "0o600"


@pytest.mark.parametrize(("user", "match"), [
    ("root", "is root"), ("0", "is root"), ("no-such-user-zz", "is no user on this host"),
    ("4321", "the agent's own user")])
def test_a_team_may_not_run_as_root_the_agent_or_nobody_known(top: Path, user: str,
                                                              match: str) -> None:
    with pytest.raises(ConfigError, match=f"job_users.vision: .*{match}"):
        JobUsers(str(top), {"vision": user}, agent_uid=4321)
    with pytest.raises(ConfigError, match=f"job_user: .*{match}"):
        JobUsers(str(top), shared=user, agent_uid=4321)


def test_what_the_agent_says_when_it_cannot_isolate(top: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    off = resolve(str(top), False, {}, "", "61184-65519")
    assert off.users is None and off.short.startswith("off")
    monkeypatch.setattr(users.os, "geteuid", lambda: 1000)
    none = resolve(str(top), True, {}, "", "61184-65519")
    assert none.users is None and "not root" in none.summary and "credentials" in none.summary
    assert none.short == "none: agent not root, jobs run as its user"


@ROOT_ONLY
def test_jobs_go_where_their_users_can_reach(tmp_path: Path, top: Path) -> None:
    assert users.jobs_dir(str(top / "work"), "n1") == str(top / "work")
    moved = users.jobs_dir(str(tmp_path / "work"), "n1")  # (/tmp/pytest-of-root: 0700)
    try:
        assert moved.startswith("/var/tmp/spillway-root/n1-")
        assert users.traversable(moved) == ""
    finally:
        os.rmdir(moved)  # (no ghost: it was made for this test's work dir alone)


@ROOT_ONLY
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("way", ["direct", "sourced", "forked"])
def test_the_drop_happens_before_the_spec_env_reaches_any_process(top: Path, gated: bool,
                                                                  way: str) -> None:
    """A job's LD_PRELOAD (a library an earlier job planted) loads only as the job's user,
    every way a job is started: ``direct``, setpriv with the job's environment where the spec
    sets nothing a C library acts on as root (no LD_PRELOAD then: the job just runs as its
    user); ``sourced``, setpriv with PATH alone, the job's own environment read from a file
    as its user; ``forked`` (an env name a shell cannot export), a forked child that switches
    uid, gid and groups before exec. Where the job must be moved into its cgroup by the agent
    (v2: ``gated``), its process waits as the job's user at a gate. Nothing runs as root with
    the spec's environment."""
    from workers.detection import detect

    if shutil.which("gcc") is None:
        pytest.skip("no gcc to build the planted library")
    log = top / "loads"
    log.touch()
    os.chmod(log, 0o666)
    src, lib = top / "p.c", top / "p.so"
    src.write_text('#include <stdio.h>\n#include <unistd.h>\n__attribute__((constructor)) '
                   f'static void p(void) {{ FILE *f = fopen("{log}", "a"); if (f) {{ '
                   'fprintf(f, "%d %d\\n", (int)getuid(), (int)geteuid()); fclose(f); } }\n')
    assert os.system(f"gcc -shared -fPIC -o {lib} {src}") == 0
    os.chmod(lib, 0o755)
    h = Harness(top / "h")
    h.sup.close()
    iso = detect("users-test", str(top / "iso"), warn=False)
    if gated:
        if not iso.node_dirs:
            pytest.skip("no cgroups here")
        iso.by_thread = False  # the v2 way: the agent moves the waiting process in
    team_users = JobUsers(str(top / "jobs"), uid_range="61184-65519", agent_uid=0)
    h.sup = Supervisor(h.store, str(h.work_dir), on_exit=h._on_exit, isolation=iso,
                       users=team_users, jobs_dir=str(top / "jobs"))
    try:
        job = h.place(command='id -u; id -G; echo "home=$HOME"; cat /proc/self/cgroup; '
                              'test -w "$TMPDIR" && echo scratch-ok',
                      env={"direct": {"PLAIN": "1"}, "sourced": {"LD_PRELOAD": str(lib)},
                           "forked": {"LD_PRELOAD": str(lib), "A.B": "1"}}[way])
        part = h.run(job)
        assert part.exit_code == 0, h.lines(job)
        uid = team_users.for_team(job.team).uid
        out = h.lines(job, "out")
        assert out[:2] == [str(uid), str(uid)]  # its uid, and its own group alone
        assert f"home={top}/jobs/home/{uid}" in out and "scratch-ok" in out
        if iso.node_dirs:
            assert any("users-test" in line for line in out)  # in its cgroup before it ran
        loads = [tuple(map(int, ln.split())) for ln in log.read_text().splitlines()]
        assert all(u == e == uid for u, e in loads), loads
        assert bool(loads) is (way != "direct")
        assert not list(Path(top / "jobs" / "home" / str(uid)).glob(".spillway-env-*"))
    finally:
        h.sup.close()
        for d in iso.node_dirs:
            with contextlib.suppress(OSError):
                os.rmdir(d)


@ROOT_ONLY
@pytest.mark.parametrize(("mode", "owner", "group", "ok"), [
    (0o700, True, False, True), (0o700, False, False, False), (0o710, False, True, True),
    (0o701, False, False, True), (0o770, False, False, False), (0o755, False, False, True)])
def test_a_workdir_the_jobs_user_cannot_enter_is_said_before_it_runs(
        top: Path, mode: int, owner: bool, group: bool, ok: bool) -> None:
    from workers.procs import can_enter
    from workers.users import JobIdentity

    d = top / "a" / "b"
    d.mkdir(parents=True)
    os.chmod(top / "a", mode)
    os.chown(top / "a", 61190 if owner else 0, 61191 if group else 0)
    ident = JobIdentity(61190, 61190, (61191,), "x", "/")
    assert can_enter(str(d), ident) is ok
    assert users.blocked_at(str(d), 61190, frozenset({61190, 61191})) == ("" if ok else
                                                                            str(top / "a"))
    assert can_enter(str(top / "missing"), ident) is False
