"""Every next step `spillway up`, `spillway up --cloud local` and `spillway demo` print works
when copied into a second shell: real processes, each hint run by a fresh bash whose
environment has no SPILLWAY_* variable (only the exports the hints themselves print)."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import Client
from broker.model.state import TERMINAL, JobState
from tests.integration.harness import wait_until

pytestmark = pytest.mark.integration

JOB_ID = re.compile(r"\bj-[0-9a-z]+\b")


def fresh_env(tmp_path: Path) -> dict[str, str]:
    """A new shell's: no cluster, no config, `spillway` on the PATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SPILLWAY_") and k != "REDIS_URL"}
    env.update(HOME=str(tmp_path / "home"), TMPDIR=str(tmp_path), COLUMNS="200",
               PYTHONUNBUFFERED="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    return env


class Up:
    """`spillway up` as a process, its output read line by line."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.tmp_path = tmp_path
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker.cli", "up", "--gpus", "2xA100-80GB", "--cpus", "8",
             "--node-id", f"hints-{uuid.uuid4().hex[:6]}", "--state-dir",
             str(tmp_path / "state"), *args],
            env=fresh_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, stdin=subprocess.DEVNULL, cwd=tmp_path)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def hints(self, timeout: float = 90) -> list[str]:
        """The lines under "In another shell:", once printed."""
        deadline = time.monotonic() + timeout
        while not self.seen or not self.seen[-1].startswith("Ctrl-C stops everything"):
            assert time.monotonic() < deadline, "".join(self.seen)
            assert self.proc.poll() is None or not self.lines.empty(), "".join(self.seen)
            try:
                self.seen.append(self.lines.get(timeout=0.2))
            except queue.Empty:
                continue
        start = next(i for i, line in enumerate(self.seen) if line.startswith("In another"))
        return [line.strip() for line in self.seen[start + 1:-1]]

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        rest = []
        while not self.lines.empty():
            rest.append(self.lines.get())
        assert code == 0, "".join(self.seen + rest)
        return "".join(self.seen + rest)


@pytest.fixture
def start_up(tmp_path: Path) -> Iterator[list[Up]]:
    started: list[Up] = []
    yield started
    for up in started:
        if up.proc.poll() is None:
            up.proc.kill()
            up.proc.wait()


def second_shell(tmp_path: Path, exports: list[str], command: str
                 ) -> subprocess.CompletedProcess[str]:
    """``command`` as a user pastes it into another shell after the printed exports."""
    cwd = tmp_path / "project"
    cwd.mkdir(exist_ok=True)
    script = "set -e\n" + "\n".join([*exports, command]) + "\n"
    done = subprocess.run(["bash", "-c", script], env=fresh_env(tmp_path), cwd=cwd,
                          capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{command!r} failed ({done.returncode}):\n{done.stdout}" \
                                 f"\n{done.stderr}"
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done


def url_of(exports: list[str], tmp_path: Path) -> str:
    out = second_shell(tmp_path, exports, 'printf %s "$SPILLWAY_REDIS_URL"').stdout
    assert out.startswith("redis://"), out
    return out


def ended(url: str, job_id: str) -> JobState:
    with Client(url) as client:
        return wait_until(lambda: (lambda j: j.state if j.state in TERMINAL else None)(
            client.get(job_id)), 60, f"{job_id} to end")


def test_every_hint_of_spillway_up_works_in_another_shell(tmp_path: Path,
                                                          start_up: list[Up]) -> None:
    up = Up(tmp_path)
    start_up.append(up)
    hints = up.hints()
    exports = [h for h in hints if h.startswith("export ")]
    commands = [h for h in hints if not h.startswith("export ")]
    assert [e.split("=")[0] for e in exports] == ["export SPILLWAY_REDIS_URL"]
    assert [c.split()[:2] for c in commands] == [["spillway", "submit"], ["spillway", "queue"]]
    url = url_of(exports, tmp_path)
    job = None
    for command in commands:
        out = second_shell(tmp_path, exports, command).stdout
        job = job or JOB_ID.search(out)
    assert job is not None
    assert ended(url, job.group(0)) is JobState.SUCCEEDED
    up.stop()


def test_every_hint_of_spillway_up_with_the_local_cloud_works_in_another_shell(
        tmp_path: Path, start_up: list[Up]) -> None:
    up = Up(tmp_path, "--cloud", "local")
    start_up.append(up)
    hints = up.hints()
    exports = [h for h in hints if h.startswith("export ")]
    commands = [h for h in hints if not h.startswith("export ")]
    # the generated configuration (its local provider) reaches the second shell
    assert [e.split("=")[0] for e in exports] == ["export SPILLWAY_REDIS_URL",
                                                  "export SPILLWAY_CONFIG"]
    assert exports[1].endswith("/state/config-cloud.yaml")
    assert [c.split()[:2] for c in commands] == [
        ["spillway", "submit"], ["spillway", "queue"], ["spillway", "offers"],
        ["spillway", "launch"], ["spillway", "instances"]]
    outputs = {c.split()[1]: second_shell(tmp_path, exports, c).stdout for c in commands}
    offer_id = commands[3].split()[2]
    assert offer_id in outputs["offers"] and "local*" in outputs["offers"]
    assert offer_id in outputs["launch"] and "REQUESTED" in outputs["launch"]
    url = url_of(exports, tmp_path)
    with Client(url) as client:  # the machine launched by hand boots and joins as a node
        wait_until(lambda: any(i.state.value == "READY" for i in client.store.instances()),
                   60, "the launched machine to be READY")
    up.stop()  # (which gives the machine back: tests/integration/test_cloud_local.py)


def test_the_next_steps_the_demo_prints_work_against_spillway_up(
        tmp_path: Path, start_up: list[Up]) -> None:
    demo = subprocess.run([sys.executable, "-m", "broker.cli", "demo", "--no-cloud", "--jobs",
                           "2"], env=fresh_env(tmp_path), capture_output=True, text=True,
                          timeout=150, stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    said = " ".join(demo.stdout.split())  # (a hint may wrap across lines)
    hints = list(dict.fromkeys(re.findall(r"`(spillway [^`]+)`", said)))
    assert "spillway up" in hints, said
    assert any(h.startswith("spillway submit") for h in hints), said
    up = Up(tmp_path)
    start_up.append(up)
    exports = [h for h in up.hints() if h.startswith("export ")]
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / "train.py").write_text("print('training')\n")  # "from your project's directory"
    job_id = ""
    for hint in hints:
        if hint.split()[:2] == ["spillway", "up"]:
            continue  # (what runs above)
        if "JOB" in hint.split():  # the one placeholder: the job the submit hint made
            assert job_id, f"{hint!r} names JOB before any submit hint"
            hint = " ".join(job_id if w == "JOB" else w for w in hint.split())
        out = second_shell(tmp_path, exports, hint).stdout
        if hint.startswith("spillway submit"):
            found = JOB_ID.search(out)
            assert found, out
            job_id = found.group(0)
    assert job_id
    assert ended(url_of(exports, tmp_path), job_id) is JobState.SUCCEEDED
    up.stop()
