"""The API server for people (`spillway api`): submit, watch and cancel jobs, operate nodes
and manage tokens over HTTPS, each call checked against a token's role and teams.

* :mod:`broker.api.app`: the FastAPI app, its JSON errors, the token check;
* :mod:`broker.api.auth`: who may do what;
* :mod:`broker.api.jobs`, :mod:`broker.api.ops`: the routes;
* :mod:`broker.api.remote`: the client's side (the HTTP transport of broker/client.py);
* :mod:`broker.api.server`: running it on uvicorn, with TLS.

The server needs the ``api`` extra (fastapi, uvicorn); the client's side needs nothing extra.
"""
