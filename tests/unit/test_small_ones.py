"""The small ones of the issue (item 8): what a user reads in each of these corners."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import Client
from broker.config.core import Config
from broker.control.loop import one_cycle
from broker.model import Gpu, Node
from broker.model.gpus import parse_inventory
from broker.model.state import JobState
from broker.store.events import Exited, Started
from tests.conftest import cli_env, flushed_db, run_cli

DB = 5  # this module's own database on the session's Redis


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cli_env(monkeypatch, tmp_path)


@pytest.fixture
def url(redis_url: str) -> Iterator[str]:
    yield from flushed_db(redis_url, DB)


cli = run_cli


def _client(url: str) -> Client:
    """A client of a cluster of one node (n1, 2 A100-80GB)."""
    c = Client(url, Config())
    gpus = tuple(Gpu(f"GPU-n1-{i}", i, "A100-80GB", 80.0) for i in range(2))
    c.store.heartbeat(Node("n1", gpus, hostname="n1", cpus=8, memory_gb=64,
                           incarnation="i1"), ttl=60, now=time.time())
    return c


def _run_one(c: Client, job_id: str, exit_code: int, reason: str = "Exited") -> None:
    """Place the job on n1, start it, end it with ``exit_code`` and ``reason``."""
    one_cycle(c._rt)
    job = c.get(job_id)
    assert job.state is JobState.STARTING
    c.store.report(job_id, job.attempt, Started(0, 123), time.time())
    c.store.report(job_id, job.attempt, Exited(0, exit_code, reason), time.time())


def test_a_family_without_its_memory_says_exactly_what_to_write() -> None:
    with pytest.raises(ValueError) as e:
        parse_inventory("2xA100")
    assert str(e.value) == ("GPU model 'A100' is ambiguous: A100s come with 40 or 80 GB; "
                            "write 2xA100-40GB or 2xA100-80GB")
    assert [(x.count, x.model) for x in parse_inventory("2xA100-80G,1xH200")] == [
        (2, "A100-80GB"), (1, "H200-141GB")]  # (a family of one size needs none)


def test_logs_of_an_attempt_that_never_was_exit_1(url: str) -> None:
    with _client(url) as c:
        job = c.submit(command="true", workdir="/")
        code, out, err = cli(url, "logs", job.id, "--attempt", "2")
        assert code == 1 and out == ""
        assert err.strip() == (f"error: job {job.id} has no attempt 2; it has had 1 "
                               "(--attempt 1 or leave it out for the current one)")
        assert cli(url, "logs", job.id, "--attempt", "1")[0] == 0
        assert cli(url, "logs", job.id, "--attempt", "0")[0] == 1


def test_submit_wait_says_the_cause(url: str, monkeypatch: pytest.MonkeyPatch,
                                   tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    with _client(url) as c:
        def finish() -> None:
            for _ in range(200):
                jobs = c.list()
                if jobs:
                    _run_one(c, jobs[0].id, 143, "TimeLimit")
                    return
                time.sleep(0.02)
        t = threading.Thread(target=finish)
        t.start()
        code, out, err = cli(url, "submit", "--time-limit", "1m", "--wait", "--", "sleep", "99")
        t.join()
    assert out, err
    job_id = out.split()[0]
    assert code == 1
    assert out.splitlines()[-1] == (f"{job_id} FAILED: TimeLimit, it ran past its time limit "
                                    "(1m00s) and was stopped (exit code 143)")


def test_explain_names_an_unnamed_job_once(url: str) -> None:
    with _client(url) as c:
        unnamed = c.submit(command="true", workdir="/")
        named = c.submit(command="true", workdir="/", name="train-17")
    out = cli(url, "explain", unnamed.id)[1]
    assert out.splitlines()[0] == f"{unnamed.id} is PENDING"
    assert cli(url, "explain", named.id)[1].splitlines()[0] == f"{named.id} (train-17) is PENDING"


def test_readme_reason_table_has_every_code_explain_gives() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    table = readme.split("| code | meaning | what to do |", 1)[1].split("\n\n", 1)[0]
    firsts = " ".join(row.split("|")[1] for row in table.strip().splitlines()[1:])
    for code in ("NotScheduledYet", "Starting", "Running", "Stopping", "Succeeded", "Failed",
                 "Cancelled"):
        assert f"`{code}`" in firsts, code


def test_demo_says_why_a_low_job_started_first_and_what_to_try_next() -> None:
    from broker.cli.demo_board import closing_notes
    from broker.model import Attempt, JobSpec
    from broker.model import Job as J

    def job(i: int, name: str, priority: str, gpus: int, started: float) -> J:
        spec = JobSpec(command="true", name=name, priority=priority, gpus=gpus)
        return J(id=f"j-{i}", spec=spec, state=JobState.SUCCEEDED, submitted_at=0.0,
                 attempts=(Attempt(1, (), started),))

    jobs = [job(1, "train-vit", "normal", 4, 9.0), job(2, "hparam-a", "low", 1, 2.0),
            job(3, "eval-bert", "high", 1, 1.0)]
    lines = closing_notes(jobs, Config())
    assert lines[0] == (
        "hparam-a (low) started before train-vit (normal): backfill. train-vit needed 4 GPUs "
        "free together and fewer were; hparam-a fitted in the GPUs left idle meanwhile, never "
        "delaying the job first in line. `spillway explain JOB` says why a job waits.")
    assert lines[1].startswith("Next: `spillway up` runs this cluster until Ctrl-C")
    assert "spillway submit --gpus 1 -- python train.py" in lines[1]
    assert closing_notes(jobs[2:], Config())[0].startswith("Next:")
