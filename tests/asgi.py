"""Call the API app in process, through ASGI (no server, no HTTP client library)."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import quote


async def call_asgi(app: Any, method: str, path: str, body: bytes, token: str,
                    query: str = "") -> tuple[int, bytes]:
    """(status, body) of one request to the ASGI ``app`` (the API fuzzers' too)."""
    headers = [(b"host", b"test"), (b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    if token:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "https", "path": path,
             "raw_path": quote(path).encode(), "query_string": query.encode(),
             "headers": headers, "client": ("127.0.0.1", 1), "server": ("test", 443),
             "root_path": ""}
    sent = False
    status, chunks = 0, []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()  # (a disconnect would come here: never)
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(msg: dict[str, Any]) -> None:
        nonlocal status
        if msg["type"] == "http.response.start":
            status = msg["status"]
        elif msg["type"] == "http.response.body":
            chunks.append(msg.get("body", b""))

    await asyncio.wait_for(app(scope, receive, send), 30)
    return status, b"".join(chunks)


def call(app: Any, method: str, path: str, doc: Any = None, token: str = "",
         raw: bytes | None = None) -> tuple[int, Any]:
    """(status, the reply's JSON) of one request; ``doc`` is sent as JSON as Python writes
    it (NaN and Infinity included), or ``raw`` as it is."""
    body = raw if raw is not None else (b"" if doc is None else json.dumps(doc).encode())
    status, out = asyncio.run(call_asgi(app, method, path, body, token))
    return status, json.loads(out) if out else None
