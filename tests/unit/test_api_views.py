"""What a token is shown: another team's job unnamed, with its class and team (a preemption's
reason); every spec secret masked as the CLI masks it (the app's response class)."""

from __future__ import annotations

import json

import pytest

from broker.api.views import HIDDEN, MaskedJSON, unnamed
from broker.security.redact import masked

THEIRS, OURS = "j-0123456789ab", "j-ba9876543210"


@pytest.mark.parametrize("said, shown", [
    (f"preempted by {THEIRS} (critical, team nlp)", f"preempted by {HIDDEN}"),
    (f"preempted by {OURS} (high, team vision)", f"preempted by {OURS} (high, team vision)"),
    (f"preempted by {THEIRS} (team nlp)", f"preempted by {HIDDEN}"),
    (f"would fit now but would delay the reservation of {THEIRS} (its estimate ends after "
     "3m)", f"would fit now but would delay the reservation of {HIDDEN} (its estimate ends "
     "after 3m)"),
    (f"evicting 2 job(s) to make room: {THEIRS}, {OURS}",
     f"evicting 2 job(s) to make room: {HIDDEN}, {OURS}"),
    (f"backfill window closed: the reservation of {THEIRS} is due",
     f"backfill window closed: the reservation of {HIDDEN} is due"),
])
def test_another_teams_job_is_unnamed_with_its_class_and_team(said: str, shown: str) -> None:
    doc = {"history": [["STOPPING", 1.0, said, 1, "priority"]], "message": said}
    assert unnamed(doc, {THEIRS}) == {"history": [["STOPPING", 1.0, shown, 1, "priority"]],
                                      "message": shown}
    assert unnamed(doc, set()) == doc


def test_every_reply_is_masked_by_the_clis_rule() -> None:
    doc = {"id": OURS, "spec": {"command": "run --db postgres://u:hunter2-long@h/x",
                                "env": {"HF_TOKEN": "hf_abcdefghijkl", "SEED": "1"}},
           "history": [["CANCELLED", 1.0, "by redis://a:pw-0123456789@h:6379", 1]]}
    body = bytes(MaskedJSON(doc).body)
    assert json.loads(body) == masked(doc)
    for secret in (b"hunter2-long", b"hf_abcdefghijkl", b"pw-0123456789"):
        assert secret not in body
    assert json.loads(body)["spec"]["env"] == {"HF_TOKEN": "***", "SEED": "1"}
