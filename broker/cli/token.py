"""``spillway api`` (the API server for people) and ``spillway token create|list|revoke``.

Token commands talk to Redis directly with a ``redis://`` URL (how the first admin token is
made) or to the API server with an ``https://`` URL and an admin token.
"""

import getpass
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from broker.cli.common import err, out, print_fitted, print_json, settings, spec_error, table_width
from broker.cli.root import app

Opt = typer.Option

tokens = typer.Typer(help="API tokens: one per person, bound to a role and teams (admin).",
                     no_args_is_help=True)
app.add_typer(tokens, name="token")


@app.command("api")
def api(
    ctx: typer.Context,
    host: Annotated[str, Opt("--host", help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, Opt("--port", help="TCP port.")] = 8443,
    cert: Annotated[Path | None, Opt("--cert", envvar="SPILLWAY_API_CERT",
                                     help="TLS certificate (PEM); with --key, serve https.")
                    ] = None,
    key: Annotated[Path | None, Opt("--key", envvar="SPILLWAY_API_KEY",
                                    help="TLS private key (PEM).")] = None,
    submit_rate: Annotated[float, Opt("--submit-rate", help="Jobs a second each token may "
                                                            "submit.")] = 50.0,
    submit_burst: Annotated[int, Opt("--submit-burst", help="Jobs a token may submit at "
                                                            "once.")] = 5000,
    workers: Annotated[int, Opt("--workers", help="Server processes.")] = 1,
    insecure_http: Annotated[bool, Opt("--insecure-http", help="Allow plain http on a "
                                                               "non-loopback address (behind "
                                                               "a TLS proxy).")] = False,
) -> None:
    """Serve the HTTP API for people: jobs, nodes, tokens (docs/api.md)."""
    from broker.api.server import ServeOptions, serve

    s = settings(ctx)
    scheme = "https" if cert else "http"
    err.print(f"spillway api on {scheme}://{host}:{port} (OpenAPI at /openapi.json)")
    serve(ServeOptions(redis_url=s.url(), host=host, port=port, certfile=cert, keyfile=key,
                       config_path=s.config_path, submit_rate=submit_rate,
                       submit_burst=submit_burst, workers=workers, insecure_http=insecure_http))


def _remote(ctx: typer.Context) -> tuple[Any, Any]:
    """(the API transport, None) for an https:// URL; (None, the TokenStore) for Redis."""
    client = settings(ctx).client()
    if client._remote is not None:
        return client._remote, None
    from broker.security.tokens import TokenStore

    return None, TokenStore(client.store_redis)


def _direct_actor() -> str:
    try:
        return f"{getpass.getuser()} (redis)"
    except (KeyError, OSError):
        return "? (redis)"


@tokens.command("create")
def create(
    ctx: typer.Context,
    user: Annotated[str, Opt("--user", "-u", help="Who the token is for.")],
    team: Annotated[list[str] | None, Opt("--team", "-t", help="Its team (finance: "
                                                               "repeatable).")] = None,
    role: Annotated[str, Opt("--role", "-r", help="user, finance, operator or admin.")
                    ] = "user",
    expires: Annotated[str, Opt("--expires", help="Lifetime: 12h, 30d... or never.")] = "90d",
    as_json: Annotated[bool, Opt("--json", help="Print the token and its record as JSON.")
                       ] = False,
) -> None:
    """Create a token and print it once (it is stored hashed: it cannot be shown again)."""
    expires_s: float | None = None
    if expires.strip().lower() != "never":
        from broker.model.spec import parse_duration

        try:
            expires_s = parse_duration(expires)
        except ValueError as e:
            raise spec_error("expires", str(e), "a duration like 12h or 30d, or never") from None
    remote, store = _remote(ctx)
    if remote is not None:
        doc = remote.call("POST", "/v1/tokens", {"user": user, "role": role,
                                                 "teams": list(team or ()),
                                                 "expires_s": expires_s})
        token, record = doc["token"], doc["record"]
    else:
        now = time.time()
        token, rec = store.create(user, role, list(team or ()), now, expires_s,
                                  by=_direct_actor())
        record = rec.to_dict(now)
    if as_json:
        print_json({"token": token, "record": record})
        return
    err.print(f"token {record['id']} for {record['user']} (role {record['role']}, teams "
              f"{','.join(record['teams']) or '-'}); shown once, keep it in a file of mode 0600:")
    out.print(token)


def _when(t: float | None) -> str:
    return "never" if t is None else time.strftime("%Y-%m-%d %H:%M", time.gmtime(t))


@tokens.command("list")
def list_(
    ctx: typer.Context,
    as_json: Annotated[bool, Opt("--json", help="Print JSON (a list of records).")] = False,
) -> None:
    """List tokens (never their secrets): id, user, role, teams, status, expiry."""
    remote, store = _remote(ctx)
    now = time.time()
    records = remote.call("GET", "/v1/tokens") if remote is not None \
        else [r.to_dict(now) for r in store.list()]
    if as_json:
        print_json(records)
        return
    if not records:
        err.print("no tokens; create one with `spillway token create --user U --team T`")
        return
    table = Table(header_style="bold", box=None)
    for col in ("id", "user", "role", "teams", "status", "expires (UTC)", "created by"):
        table.add_column(col)
    for r in records:
        table.add_row(r["id"], r["user"], r["role"], ",".join(r["teams"]) or "-", r["status"],
                      _when(r["expires_at"]), r["created_by"])
    width = table_width()
    print_fitted(table, width)


@tokens.command("revoke")
def revoke(
    ctx: typer.Context,
    token_ids: Annotated[list[str], typer.Argument(metavar="ID...", help="Token ids (see "
                                                                         "`token list`).")],
) -> None:
    """Revoke tokens: every call made with them is refused from now on."""
    remote, store = _remote(ctx)
    for token_id in token_ids:
        if remote is not None:
            if len(token_id) != 12:
                raise spec_error("token", f"{token_id!r} is not a token id",
                                 "12 hex digits from `spillway token list`")
            rec = remote.call("POST", f"/v1/tokens/{token_id}/revoke")
        else:
            rec = store.revoke(token_id, time.time(), by=_direct_actor()).to_dict()
        out.print(f"{rec['id']} revoked ({rec['user']})")
