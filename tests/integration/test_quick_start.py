"""The README's quick start as written, with a real scheduler and agent: `python train.py`
submitted from the directory that holds train.py runs there (issue item 1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.harness import running, with_db

pytestmark = pytest.mark.integration

DB = 6  # this module's own database on the session's Redis

TRAIN = """import os, sys
print("training with", sys.argv[1:], "in", os.getcwd())
open("model.txt", "w").write("weights\\n")
"""


def test_python_train_py_runs_in_the_submit_directory(redis_url: str, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(TRAIN)
    with running(with_db(redis_url, DB), tmp_path / "cluster") as c:
        c.workdir.mkdir()
        c.start_scheduler()
        c.start_agent("n1", "8xA100-80GB")
        env = c.env
        done = subprocess.run(
            [sys.executable, "-m", "broker.cli", "submit", "--gpus", "4", "--gpu-type", "A100",
             "-p", "high", "-t", "vision", "--time-limit", "6h", "--wait", "--", "python",
             "train.py", "--lr", "3e-4"],
            cwd=project, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        job_id = done.stdout.split()[0]
        assert f"{job_id} SUCCEEDED" in done.stdout
        assert (project / "model.txt").read_text() == "weights\n"
        logs = subprocess.run([sys.executable, "-m", "broker.cli", "logs", job_id], cwd=project,
                              env=env, capture_output=True, text=True, timeout=30)
        assert logs.stdout.strip() == f"training with ['--lr', '3e-4'] in {project}"
        assert os.path.isfile(c.workdir / "n1" / "logs" / f"{job_id}.1.log")
