"""``spillway demo``'s own pieces without processes: the closing story names where each burst job
ran (from the records), and the board and its prose fit 80 columns without cutting a name,
a device list, a machine's jobs or its last move (tests/integration/test_embedded.py runs it)."""

from __future__ import annotations

import re
import time
from dataclasses import replace

import pytest
from rich.console import Console

from broker.cli import demo_board as demo_mod
from broker.cli.demo_board import CLOUD_WORKLOAD, WORKLOAD, Board, as_ranges, say
from broker.cli.demo_cloud import Machines, notes
from broker.model import Allocation, Attempt, Instance, InstanceState, Job, StateChange
from broker.model.state import JobState
from tests.builders import job

ONPREM = "demo-node"
OFFER = "local:home:home-a:ondemand/local-4xa100-80gb"


def ran(j: Job, *nodes: str) -> Job:
    """``j`` ended, its attempts on ``nodes`` in order (two GPUs each)."""
    attempts = tuple(Attempt(n, (Allocation(node, (f"GPU-{node}-0", f"GPU-{node}-1")),),
                             10.0 + n, 12.0 + n) for n, node in enumerate(nodes, 1))
    return replace(j, state=JobState.SUCCEEDED, attempts=attempts, attempt=len(nodes),
                   allocations=())


def machine(rid: str, requested: float, for_jobs: tuple[str, ...]) -> Instance:
    return Instance(rid, OFFER, InstanceState.TERMINATED, f"local-{rid}", f"local-{rid}",
                    requested, price_per_hour=12.0, for_jobs=for_jobs,
                    history=(StateChange(InstanceState.TERMINATED, requested + 9,
                                         "released: drained and idle"),))


def test_the_story_names_where_each_burst_job_ran_not_the_machine_rented_for_it() -> None:
    # Two machines booting side by side: the jobs rented cloud-1 ran on cloud-2 (up first)
    # and cloud-2's job on cloud-1; a third job's machine came after on-prem GPUs freed up.
    # The story used to say "rented cloud-1 for eval-bert" and count train-resnet among
    # "more jobs that ran there too", as if each job ran on the machine rented for it.
    bert = ran(job("j-bert", 1, priority="high", name="eval-bert"), "local-burst-b")
    embed = ran(job("j-embed", 2, priority="high", name="embed-corpus"), "local-burst-b")
    resnet = ran(job("j-resnet", 4, priority="high", name="train-resnet"), "local-burst-a")
    vit = ran(job("j-vit", 2, priority="high", name="train-vit"), ONPREM)
    moved = ran(job("j-moved", 2, priority="high", name="moved"), ONPREM, "local-burst-c")
    low = ran(job("j-low", 1, priority="low", name="hparam-a"), "local-burst-b")
    machines = Machines()
    # listed out of request order (two polls): cloud-N follows first sight, the story the
    # request order
    machines.update([machine("burst-b", 101.0, ("j-resnet",))])
    machines.update([machine("burst-a", 100.0, ("j-bert", "j-embed")),
                     machine("burst-c", 102.0, ("j-vit", "j-moved"))])
    assert machines.names == {"burst-b": "cloud-1", "burst-a": "cloud-2", "burst-c": "cloud-3"}
    [story] = notes(machines, [bert, embed, resnet, vit, moved, low], ONPREM)
    assert story.startswith(
        "eval-bert (high, SLA 10s) found on-prem full until its long jobs ended: its SLA would "
        f"break, so the burst phase rented cloud-2 for it ({OFFER}, $12.00/h) through the "
        "provisioner, but it ran on cloud-1 instead. ")
    assert ("Rented: cloud-2 for eval-bert (ran on cloud-1), embed-corpus (ran on cloud-1); "
            "cloud-1 for train-resnet (ran on cloud-2); cloud-3 for train-vit (ran on onprem), "
            "moved (ran on onprem then cloud-3).") in story
    # only the low job, rented for by nobody, is one of the "more" jobs
    assert "1 more job(s) that fitted ran there too" in story
    # and where the jobs ran as rented, it says so
    [story] = notes(machines, [ran(bert, "local-burst-a")], ONPREM)
    assert "through the provisioner, and it ran there." in story


def test_the_story_without_machines_says_none_was_rented() -> None:
    assert notes(Machines(), [], ONPREM) == [
        "No cloud machine was rented: on-prem started every job within its SLA."]


def board_of(plan: tuple[demo_mod.DemoJob, ...], n: int = 24) -> Board:
    """A board of ``n`` jobs of ``plan`` (names up to finetune-llama-2), each ended on-prem or
    on cloud-1, two machines with several jobs each and long last moves."""
    now = time.time()
    board = Board(None, ONPREM, "8xA100-80GB", cloud=True)
    assert board.machines is not None
    jobs = demo_mod.workload(n, cloud=plan is CLOUD_WORKLOAD)
    for i, d in enumerate(jobs):
        node = ONPREM if i % 2 else "local-burst-a"
        j = job(f"j-{i:012x}", d.gpus, priority=d.priority, name=d.name, submitted=now - 30)
        gpus = tuple(f"GPU-{node}-{k}" for k in range(d.gpus))
        j = replace(j, state=JobState.SUCCEEDED, attempt=1,
                    attempts=(Attempt(1, (Allocation(node, gpus),), now - 20, now - 5),))
        board.plan[j.id], board.jobs[j.id], board.cursor[j.id] = d, j, "0"
        board.devices[j.id] = ",".join(gpus)
        board.last_line[j.id] = f"{d.name}: done"
    ids = list(board.jobs)
    board.machines.update([
        replace(machine("burst-a", now - 25, tuple(ids[:4])), provider_id="local-burst-a"),
        machine("burst-0123456789abcdef", now - 24, tuple(ids[4:6]))])
    return board


def lines_at(renderable: object, width: int) -> list[str]:
    console = Console(width=width, record=True, highlight=False)
    console.print(renderable)
    return console.export_text().splitlines()


def machine_cells(lines: list[str]) -> dict[str, tuple[str, str]]:
    """Each machine's FOR and LAST MOVE cells, their wrapped lines joined."""
    head = next(i for i, line in enumerate(lines) if line.startswith("MACHINE "))
    at_for, at_move = lines[head].index("FOR"), lines[head].index("LAST MOVE")
    cells: dict[str, list[list[str]]] = {}
    name = ""
    for line in lines[head + 1:]:
        if line.startswith("cloud-"):
            name = line.split()[0]
            cells[name] = [[], []]
        cells[name][0].append(line[at_for:at_move].strip())
        cells[name][1].append(line[at_move:].strip())
    return {k: (" ".join(filter(None, v[0])), " ".join(filter(None, v[1])))
            for k, v in cells.items()}


def test_the_board_fits_80_columns_without_cutting_names_devices_or_machines() -> None:
    for plan in (WORKLOAD, CLOUD_WORKLOAD):
        board = board_of(plan)
        lines = lines_at(board.render(80), 80)
        text = "\n".join(lines)
        assert all(len(line) <= 80 for line in lines), text
        assert "…" not in text, text  # nothing shortened with an ellipsis
        rows = {line.split()[0]: line.split() for line in lines if line.startswith("j-")}
        for j in board.jobs.values():  # the id, the whole name, the devices as ranges
            row = rows[j.id]
            assert row[1] == j.spec.name, row
            assert row[-1] == as_ranges(",".join(str(k) for k in range(j.spec.gpus))), row
        assert "(TEAM, LAST OUTPUT: not shown at 80 columns)" in text, text
        # each machine's jobs and last move whole, wrapped at words
        cells = machine_cells(lines)
        names = [board.jobs[j].spec.name for j in list(board.jobs)[:4]]
        assert cells["cloud-1"] == (", ".join(names), "released: drained and idle"), text
        assert cells["cloud-2"][1] == "released: drained and idle", text
    # a wide terminal: one line a job and a machine, every column, device lists as printed
    lines = lines_at(board_of(CLOUD_WORKLOAD).render(200), 200)
    assert any(re.search(r"\b4,5,6,7\b|\b0,1,2,3\b", line) for line in lines), lines
    assert any("local-burst-0123456789abcdef" in line for line in lines), lines
    assert not any("not shown" in line for line in lines), lines


def test_device_lists_become_ranges_only_for_runs_of_three() -> None:
    assert as_ranges("0,1,2,3") == "0-3"
    assert as_ranges("4,5,6,7") == "4-7"
    assert as_ranges("0,1") == "0,1"
    assert as_ranges("0,1,2,5,7,8,9") == "0-2,5,7-9"
    assert as_ranges("GPU-x-0,GPU-y-1") == "GPU-x-0,GPU-y-1"
    assert as_ranges("") == ""


def test_prose_wraps_at_words_and_never_inside_a_command(
        capsys: pytest.CaptureFixture[str]) -> None:
    text = ("Next: `spillway up` runs this cluster until Ctrl-C (`--cloud local` adds the cloud) "
            "and prints a line; there: `spillway submit --gpus 1 -- python train.py`, then "
            "`spillway logs -f JOB`.\nA second paragraph.")
    say(text, 80)
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert all(line.count("`") % 2 == 0 for line in lines), lines  # no command split
    assert " ".join(lines[:-1]) == text.split("\n")[0]
    assert lines[-1] == "A second paragraph."
