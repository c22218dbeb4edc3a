"""Jobs run where they were submitted (issue item 1): the client and the CLI record the submit
directory as the spec's workdir; the agent runs in it where it exists on the node, otherwise in
a fresh directory of the job's own under its work directory, and says so in the job's log and
history."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from broker.cli import app
from broker.client import Client
from broker.config.core import Config
from broker.store.events import Started
from tests.conftest import flushed_db
from tests.unit.test_runner import GPUS, NODE, Harness

DB = 15  # this module's own database on the session's Redis


@pytest.fixture
def url(redis_url: str) -> Iterator[str]:
    yield from flushed_db(redis_url, DB)


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    try:
        yield harness
    finally:
        harness.sup.close()


def test_client_records_the_submit_directory(url: str, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with Client(url, Config(hold_if_infeasible=True)) as c:  # no node registered here
        assert c.submit(command="python train.py").spec.workdir == str(tmp_path)
        assert c.submit(command="true", workdir="/srv").spec.workdir == "/srv"  # given: kept
        (tmp_path / "sub").mkdir()
        assert c.submit(command="true", workdir="sub").spec.workdir == str(tmp_path / "sub")
        many = c.submit_many([{"command": "true"}, {"command": "true", "workdir": "/x"}])
        assert [j.spec.workdir for j in many] == [str(tmp_path), "/x"]


def test_cli_records_the_submit_directory(url: str, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPILLWAY_CONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["--redis-url", url, "submit", "--json",
                                      "--hold-if-infeasible", "--", "python", "train.py"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["spec"]["workdir"] == str(tmp_path)


def test_job_runs_in_its_workdir_where_it_exists(h: Harness, tmp_path: Path) -> None:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text("print('trained')\n")
    job = h.place((GPUS[0],), command="cat train.py; pwd", workdir=str(tmp_path / "proj"))
    part = h.run(job, (GPUS[0],))
    assert part.exit_code == 0 and part.note == ""
    assert h.lines(job, "out") == ["print('trained')", str(tmp_path / "proj")]
    assert h.lines(job, "err") == []


def test_missing_workdir_runs_in_a_fresh_directory_and_says_so(h: Harness, tmp_path: Path
                                                               ) -> None:
    missing = str(tmp_path / "not-on-this-node")
    a = h.place((GPUS[0],), command="pwd; echo a > out.txt", workdir=missing)
    b = h.place((GPUS[1],), command="pwd; echo b > out.txt")  # no workdir at all (old records)
    pa, pb = h.run(a, (GPUS[0],)), h.run(b, (GPUS[1],))
    assert pa.exit_code == 0 and pb.exit_code == 0
    da, db = h.lines(a, "out")[0], h.lines(b, "out")[0]
    assert da == str(h.work_dir / "jobs" / a.id) and db == str(h.work_dir / "jobs" / b.id)
    assert Path(da, "out.txt").read_text() == "a\n"  # relative outputs never collide
    assert Path(db, "out.txt").read_text() == "b\n"
    note = h.lines(a, "err")[0]
    assert note == (f"spillway: workdir {missing} does not exist on node {NODE}; running in "
                    f"{da} instead")
    assert pa.note == note.removeprefix("spillway: ")
    assert h.lines(b, "err") == [] and pb.note == ""  # no workdir was given: nothing to say
    # the agent reports the start with the note: it is in the job's history too
    job = h.store.report(a.id, a.attempt, Started(0, pa.pid, pa.note), time.time())
    assert job.history[-1].reason == f"Started; {pa.note}"
    assert os.path.isfile(os.path.join(h.work_dir, "logs", f"{a.id}.{a.attempt}.log"))
