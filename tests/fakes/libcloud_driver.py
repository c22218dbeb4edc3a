"""libcloud's dummy driver, with what a real cloud's driver has and the dummy lacks, for tests
that cross processes.

``libcloud.compute.drivers.dummy.DummyNodeDriver`` keeps its nodes in the driver object, so a
node made in the provisioner's process is invisible to the test that should boot it; its
``create_node(name, size, image)`` ignores the name and takes no metadata or user data; and it
numbers a new node ``len(nodes) + 1``, which repeats an id still in use after a destroy.
:class:`FileDummyNodeDriver` keeps its nodes in a JSON file (its ``key`` is the path, so every
process that names the same file sees the same cloud), honours the name, takes
``ex_metadata`` and ``ex_userdata`` as the OpenStack driver does (shown back in
``node.extra["metadata"]`` and ``node.extra["userdata"]``), and gives unique ids. Sizes,
images and locations are the dummy's, plus one GPU size, ``gpu-a100``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from libcloud.compute.base import Node, NodeImage, NodeSize
from libcloud.compute.drivers.dummy import DummyNodeDriver
from libcloud.compute.types import NodeState


class FileDummyNodeDriver(DummyNodeDriver):  # type: ignore[misc]
    name = "File-backed Dummy Node Provider"
    type = "file_dummy"

    def __init__(self, key: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(0)
        self.nl = []  # no default nodes: the file is the cloud
        self.path = Path(key)

    @contextlib.contextmanager
    def _nodes(self) -> Iterator[dict[str, dict[str, Any]]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                nodes = json.loads(self.path.read_text()) if self.path.exists() else {}
                yield nodes
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text(json.dumps(nodes, indent=1))
                tmp.replace(self.path)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _node(self, rec: dict[str, Any]) -> Node:
        return Node(id=rec["id"], name=rec["name"], state=NodeState(rec["state"]),
                    public_ips=[], private_ips=["127.0.0.1"], driver=self,
                    size=NodeSize(rec["size"], rec["size"], 0, 0, None, 0.0, driver=self),
                    image=NodeImage(rec["image"], rec["image"], driver=self),
                    extra={"metadata": rec["metadata"], "userdata": rec["userdata"]})

    def list_sizes(self, location: Any = None) -> list[NodeSize]:
        gpu = NodeSize("gpu-a100", "GPU A100", 65536, 200, None, 3.0, driver=self)
        return [*super().list_sizes(location), gpu]

    def list_nodes(self) -> list[Node]:
        with self._nodes() as nodes:
            return [self._node(r) for r in nodes.values()]

    def create_node(self, name: str, size: NodeSize, image: NodeImage, location: Any = None,
                    ex_metadata: dict[str, str] | None = None,
                    ex_userdata: str = "") -> Node:
        rec = {"id": f"node-{uuid.uuid4().hex[:12]}", "name": name, "state": "running",
               "size": str(size.id), "image": str(image.id),
               "metadata": dict(ex_metadata or {}), "userdata": ex_userdata}
        with self._nodes() as nodes:
            nodes[rec["id"]] = rec
        return self._node(rec)

    def destroy_node(self, node: Node) -> bool:
        with self._nodes() as nodes:
            return nodes.pop(str(node.id), None) is not None
