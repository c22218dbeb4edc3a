"""An operator forgets a dead node (``spillway nodes --forget``): one contract, both backends.
Refused for an unknown node, a live one (its agent would register it again), and one that
still holds jobs unless ``force`` (they are requeued, as lost with the node)."""

from __future__ import annotations

import pytest

from broker.errors import NodeBusy, NodeNotFound
from broker.model.state import JobState
from broker.store import BaseStore
from tests.contract.test_store_contract import T0, live, node, running, spec

TTL = 10.0
LIVE = T0 + 1  # within the lease
DEAD = T0 + TTL + 1  # after it


# (when, expire first (a reconciler ran), a job on it, force: None if forgotten, else the
# refusal's words)
@pytest.mark.parametrize(("now", "expired", "busy", "force", "refusal"), [
    (LIVE, False, False, False, "is alive: its agent's lease runs 9.0s more"),
    (LIVE, False, False, True, "is alive"),  # --force does not forget a live agent's node
    (DEAD, False, False, False, None),  # lease ran out, not yet marked DOWN: forgotten
    (DEAD, True, False, False, None),  # DOWN
    (DEAD, False, True, False, "still holds 1 job(s)"),  # no reconciler requeued them yet
    (DEAD, False, True, True, None),  # --force requeues them
    (DEAD, True, True, False, None),  # the reconciler requeued them: nothing held
])
def test_forget_dead_node(store: BaseStore, now: float, expired: bool, busy: bool,
                          force: bool, refusal: str | None) -> None:
    live(store, node("n1"), node("n2"), ttl=TTL)
    job = running(store, store.submit(spec(gpus=2), T0), ("n1", ["n1-g0", "n1-g1"])) \
        if busy else None
    if expired:
        store.expire(now)
    if refusal is not None:
        with pytest.raises(NodeBusy) as e:
            store.forget_dead_node("n1", now, force)
        assert refusal in str(e.value)
        assert [n.id for n in store.nodes()] == ["n1", "n2"]
        return
    lost = store.forget_dead_node("n1", now, force)
    assert [n.id for n in store.nodes()] == ["n2"]
    assert "n1" not in store.allocations()
    if job is not None:
        again = store.get(job.id)
        assert again.state is JobState.PENDING and again.attempt == 2
        assert [j.id for j in lost] == ([job.id] if not expired else [])
    with pytest.raises(NodeNotFound):
        store.forget_dead_node("n1", now)


def test_a_forgotten_node_comes_back_as_a_new_node_when_its_agent_does(
        store: BaseStore) -> None:
    live(store, node("n1"), ttl=TTL)
    store.forget_dead_node("n1", DEAD)
    live(store, node("n1", incarnation="i2"), ttl=TTL, now=DEAD + 1)
    assert [n.id for n in store.nodes()] == ["n1"]
