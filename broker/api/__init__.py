"""The API server for people (`spillway api`): submit, watch and cancel jobs, operate nodes
and manage tokens over HTTPS, each call checked against a token's role and teams.

* :mod:`broker.api.app`: the FastAPI app, its JSON errors, the token check;
* :mod:`broker.api.auth`: who may do what;
* :mod:`broker.api.jobs`, :mod:`broker.api.waits`, :mod:`broker.api.ops`: the routes
  (``waits``: ``wait`` and log following, asynchronous: no thread held while they wait);
* :mod:`broker.api.longpoll`: those long polls, one batched watcher a process, and each
  token's cap on them;
* :mod:`broker.api.views`: what a token is shown (secrets masked as the CLI masks them, other
  teams unnamed);
* :mod:`broker.api.remote`: the client's side (the HTTP transport of broker/client.py);
* :mod:`broker.api.server`: running it on uvicorn, with TLS.

The server needs the ``api`` extra (fastapi, uvicorn); the client's side needs nothing extra.
"""
