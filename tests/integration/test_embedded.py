"""``spillway demo`` and ``spillway up`` as a user runs them: real processes, an embedded Redis,
a local cloud whose machines are processes, and nothing left running afterwards."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import Client
from broker.model.state import JobState
from broker.waiting import poll_until

pytestmark = pytest.mark.integration

# (the embedded server's URL is printed with its password masked)
URL_RE = re.compile(r"redis://(?::\*\*\*@)?127\.0\.0\.1:(\d+)/0")


def where(m: re.Match[str]) -> str:
    """What every process of that cluster has in its environment (or command line)."""
    return f"127.0.0.1:{m.group(1)}/0"


def machines_of(where: str) -> list[str]:
    """The local cloud's machines (worker agents) of that cluster."""
    return [p for p in processes_with_env(where) if "worker\\x00--site\\x00local:" in p]


def clean_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SPILLWAY_") and k != "REDIS_URL"}
    env.update(HOME=str(tmp_path / "home"), TMPDIR=str(tmp_path), COLUMNS="200",
               PYTHONUNBUFFERED="1")
    return env


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state != "Z":
            found.append(f"{pid}: {cmd}")
    return found


def environs(text: str) -> dict[int, str]:
    """pid -> environment (NUL-separated) of the live processes whose environment mentions
    ``text`` (the demo's Redis URL reaches every process it starts: the scheduler, the
    worker, each local cloud machine and its jobs)."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in env and state != "Z":
            found[int(pid)] = env
    return found


def processes_with_env(text: str) -> list[str]:
    found = []
    for pid in environs(text):
        with contextlib.suppress(OSError):  # (gone meanwhile)
            found.append(f"{pid}: {Path(f'/proc/{pid}/cmdline').read_bytes()!r}")
    return found


def assert_all_gone(port: int, url: str) -> None:
    def left() -> list[str]:
        return processes_mentioning(url) + processes_with_env(url)

    deadline = time.monotonic() + 10
    while (port_open(port) or left()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not port_open(port), f"the embedded Redis on port {port} is still running"
    assert not left(), left()


def summary_value(stdout: str, key: str) -> str:
    """The value of one line of the demo's summary (``key   value``)."""
    m = re.search(rf"^\s*{re.escape(key)}\s+(\S+)", stdout, re.MULTILINE)
    assert m, f"no '{key}' line in the summary:\n{stdout}"
    return m.group(1)


def test_demo_runs_a_mixed_workload_and_cleans_up(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "broker.cli", "demo", "--jobs", "6",
                           "--no-cloud"],
                          env=clean_env(tmp_path), capture_output=True, text=True, timeout=150,
                          stdin=subprocess.DEVNULL)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "every job ended as planned" in proc.stdout
    for state in ("SUCCEEDED", "FAILED", "CANCELLED"):
        assert state in proc.stdout
    # The live table's rows: ID NAME TEAM CLASS GPUS STATE WAITED RAN SITE DEVICES
    # LAST-OUTPUT, DEVICES being CUDA_VISIBLE_DEVICES as each job printed it: exactly its GPU
    # count.
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("j-")]
    assert len(rows) == 6, proc.stdout
    for row in rows:
        assert row[8] == "onprem", row
        assert len(row[9].split(",")) == int(row[4]), row
    assert "cloud machines" not in proc.stdout
    assert "Traceback" not in output
    m = URL_RE.search(output)
    assert m, output
    assert_all_gone(int(m.group(1)), where(m))


XDG = ("XDG_STATE_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME")


def home_env(tmp_path: Path) -> dict[str, str]:
    """:func:`clean_env` with the XDG directories under ``tmp_path`` too, and no COLUMNS (a
    pipe: the demo's lines fit 80 columns)."""
    env = clean_env(tmp_path)
    del env["COLUMNS"]
    (tmp_path / "home").mkdir()
    env.update({key: str(tmp_path / "xdg" / key.lower()) for key in XDG})
    return env


def assert_nothing_left(tmp_path: Path) -> None:
    """Nothing under HOME, the XDG directories or TMPDIR from the demo (its temporary
    directory included), and no process with that HOME (every process the demo starts,
    rented machines and jobs included, has it)."""
    home = tmp_path / "home"
    assert not list(home.iterdir()), sorted(str(p) for p in home.rglob("*"))
    left = sorted(str(p) for p in (tmp_path / "xdg").rglob("*")) \
        if (tmp_path / "xdg").exists() else []
    assert not left, left
    assert not list(tmp_path.glob("spillway-demo-*")), list(tmp_path.glob("spillway-demo-*"))
    poll_until(lambda: not environs(f"HOME={home}\x00"), 10, "the demo's processes to end",
               error=AssertionError)


def story(stdout: str) -> str:
    """The demo's closing paragraphs, each on one line."""
    return "\n".join(" ".join(p.split()) for p in stdout.split("\n\n"))


def test_demo_piped_fits_80_columns_names_where_jobs_ran_and_leaves_nothing(
        tmp_path: Path) -> None:
    # four jobs: three fill on-prem for 18 s, then a high one finds it full and bursts
    proc = subprocess.run([sys.executable, "-m", "broker.cli", "demo", "--jobs", "4"],
                          env=home_env(tmp_path), capture_output=True, text=True, timeout=150,
                          stdin=subprocess.DEVNULL)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "every job ended as planned" in proc.stdout
    assert all(len(line) <= 80 for line in proc.stdout.splitlines()), proc.stdout
    assert "…" not in proc.stdout, proc.stdout  # nothing shortened
    lines = proc.stdout.splitlines()
    site = next(line.split() for line in lines if line.startswith("ID ")).index("SITE")
    rows = {r[1]: r for r in (line.split() for line in lines if line.startswith("j-"))}
    assert len(rows) == 4, proc.stdout
    # the story names where each job a machine was rented for ran, as the table does
    told = dict(re.findall(r"(\S+) \(ran on ([^)]+)\)", story(proc.stdout)))
    assert "train-resnet" in told, proc.stdout
    for name, places in told.items():
        assert places.split(" then ")[-1] == rows[name][site], (name, proc.stdout)
    assert "Traceback" not in output
    assert_nothing_left(tmp_path)


@pytest.mark.slow
def test_demo_bursts_to_the_local_cloud_and_gives_every_machine_back(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "broker.cli", "demo"],
                          env=clean_env(tmp_path), capture_output=True, text=True, timeout=150,
                          stdin=subprocess.DEVNULL)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "every job ended as planned" in proc.stdout
    assert "Demo classes" in proc.stdout  # it says its classes are the demo's
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("j-")]
    assert len(rows) == 12, proc.stdout
    on_cloud = [r for r in rows if re.fullmatch(r"cloud-\d+", r[8])]
    assert on_cloud, proc.stdout  # at least one job ran on a rented machine
    assert any(r[3] == "high" for r in on_cloud), proc.stdout  # one it was rented for
    for row in rows:
        assert row[8] in ("onprem", "-") or row in on_cloud, row
        if row[9] != "-":
            assert len(row[9].split(",")) == int(row[4]), row
    launched = int(summary_value(proc.stdout, "cloud machines launched"))
    assert launched >= 1, proc.stdout
    assert int(summary_value(proc.stdout, "cloud machines released")) == launched
    assert summary_value(proc.stdout, "cloud machines left running") == "0"
    assert int(summary_value(proc.stdout, "jobs run on cloud machines")) == len(on_cloud)
    assert float(summary_value(proc.stdout, "cloud cost").lstrip("$")) > 0
    machines = [line.split() for line in proc.stdout.splitlines()
                if re.match(r"cloud-\d+\s", line)]
    assert len(machines) == launched and all(m[1] == "TERMINATED" for m in machines), \
        proc.stdout
    # MACHINE STATE UP COST INSTANCE FOR LAST-MOVE: each given back once idle (none vanished
    # or reaped as an orphan), and no job rented two machines
    assert all(" ".join(m[6:]) == "released: drained and idle" for m in machines), proc.stdout
    rented_for = [job for m in machines for job in m[5].split(",")]
    assert len(rented_for) == len(set(rented_for)), proc.stdout
    assert "Traceback" not in output
    m = URL_RE.search(output)
    assert m, output
    assert_all_gone(int(m.group(1)), where(m))


@pytest.mark.slow
def test_demo_interrupted_again_and_again_mid_burst_leaves_nothing_running(tmp_path: Path) -> None:
    # Ctrl-C as a terminal sends it: the demo must see SIGINT even where this run was started
    # in the background of a shell without job control, which ignores SIGINT in its children
    proc = subprocess.Popen([sys.executable, "-m", "broker.cli", "demo"],
                            env=home_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout is not None
        url = None
        for line in proc.stdout:  # the first line names the embedded Redis
            m = URL_RE.search(line)
            if m:
                url = where(m)
                break
        assert url, "the demo never printed its Redis URL"
        deadline = time.monotonic() + 90
        # wait for a rented machine's agent (booted: it would outlive the demo if left)
        while not machines_of(url):
            assert time.monotonic() < deadline, "no cloud machine was started"
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.2)
        # an impatient user presses Ctrl-C again and again while it cleans up
        end = time.monotonic() + 90
        while proc.poll() is None and time.monotonic() < end:
            proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.3)
        rest = proc.communicate(timeout=10)[0]
        # the demo gives its machines back before it exits (left alone, their agents would
        # only give up once Redis is gone)
        assert not machines_of(url), rest
        assert proc.returncode == 130, rest
        assert "interrupted; shutting down" in rest
        assert "Traceback" not in rest
        assert_all_gone(int(url.rsplit(":", 1)[1].split("/")[0]), url)  # (url: where())
        assert_nothing_left(tmp_path)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture
def up(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], queue.Queue[str]]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker.cli", "up", "--gpus", "2xA100-80GB", "--cpus", "8",
         "--node-id", "up-test", "--state-dir", str(tmp_path / "state")],
        env=clean_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        stdin=subprocess.DEVNULL)
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    try:
        yield proc, lines
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_up_serves_jobs_and_stops_on_sigterm(up: tuple[subprocess.Popen[str],
                                                         queue.Queue[str]]) -> None:
    proc, lines = up
    seen: list[str] = []
    deadline = time.monotonic() + 60
    url = None
    while url is None:
        assert time.monotonic() < deadline, "".join(seen)
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            continue
        seen.append(line)
        m = re.search(r'export SPILLWAY_REDIS_URL="\$\(cat (\S+)\)"', line)
        url = Path(m.group(1)).read_text().strip() if m else None
        assert proc.poll() is None or url, "".join(seen)

    with Client(url) as client:
        assert [n.id for n in client.nodes()] == ["up-test"]
        job = client.submit(command="echo gpus=$CUDA_VISIBLE_DEVICES", gpus=2)
        done = client.wait(job.id, timeout=30)
        assert done.state is JobState.SUCCEEDED
        assert any("gpus=GPU-" in x.text for x in client.logs(job.id))

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    assert_all_gone(port, f"127.0.0.1:{port}/0")
