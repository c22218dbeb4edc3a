"""``spillway redis acl``: the Redis ACL user of a component, printed or applied
(broker/security/acl.py; docs/security.md)."""

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from broker.cli.common import err, fail, out, redacted, settings
from broker.cli.root import app
from broker.security import acl

redis_app = typer.Typer(help="Lock Redis down: ACL users per component (docs/security.md).",
                        no_args_is_help=True)
app.add_typer(redis_app, name="redis")

Opt = typer.Option


@redis_app.command("acl")
def acl_command(
    ctx: typer.Context,
    role: Annotated[str, Opt("--role", help="scheduler (and provisioner), api, agent, or "
                             "registrar.")] = "agent",
    node: Annotated[str | None, Opt("--node", help="The agent's node id (role agent).",
                                    show_default=False)] = None,
    user: Annotated[str | None, Opt("--user", help="The ACL user name (default: "
                                    "spillway-<role>, spillway-agent-<node>).",
                                    show_default=False)] = None,
    prefix: Annotated[str, Opt("--prefix", help="The store's key prefix.")] = "sw:",
    password_file: Annotated[Path | None, Opt(
        "--password-file", dir_okay=False, show_default=False,
        help="The user's password, read from this file (created with a random one, 0600, if "
             "missing). Printed rules carry only its SHA-256.")] = None,
    apply: Annotated[bool, Opt("--apply", help="Run ACL SETUSER on the server of "
                               "--redis-url (its user needs acl|setuser).")] = False,
    url_file: Annotated[Path | None, Opt(
        "--url-file", dir_okay=False, show_default=False,
        help="With --apply: write the URL this user connects with here (0600), for the "
             "component's SPILLWAY_REDIS_URL.")] = None,
) -> None:
    """Print the ACL SETUSER line for one component's Redis user, or apply it.

    An agent's user may write only its own node, its Celery queue, and what its jobs'
    reports and logs touch; nothing administrative. Only the registrar's user may grant
    rights (ACL SETUSER, for cloud machines' users: `spillway registrar`). Without
    --password-file the printed rules have no password: add >PASSWORD (or #SHA256) before
    running them.
    """
    from broker.control.embedded import read_or_make_secret, write_private

    try:
        spec = acl.user_for(role, node, user, prefix)
    except acl.AclError as e:
        raise fail(str(e)) from None
    try:
        password = read_or_make_secret(password_file) if password_file else None
    except OSError as e:
        raise fail(f"--password-file {password_file}: {e.strerror}") from None
    if not apply:
        out.print(escape(spec.command(password)), highlight=False, soft_wrap=True)
        return
    if url_file is None:
        raise fail("--apply needs --url-file (where the new user's URL is written, 0600); "
                   "the password is never printed")
    import redis

    base = settings(ctx).url()
    client = redis.Redis.from_url(base)
    password = password or acl.new_password()
    try:
        acl.setuser(client, spec, password)
    except acl.AclError as e:
        raise fail(str(e)) from None
    finally:
        client.close()
    url = acl.url_for(base, spec.name, password)
    try:
        write_private(url_file, url + "\n")
    except OSError as e:
        raise fail(f"--url-file {url_file}: {e.strerror}; the user {spec.name} was set: run "
                   "again with a writable --url-file (and the same --password-file)") from None
    err.print(f"user {escape(spec.name)} set on {escape(redacted(base))}; its URL is in "
              f"{escape(str(url_file))} (0600)")


@app.command()
def registrar(
    ctx: typer.Context,
    prefix: Annotated[str, Opt("--prefix", help="The store's key prefix.")] = "sw:",
    sweep_s: Annotated[float, Opt("--sweep-s", min=0.01, help="Delete the users of ended "
                                  "machines this often (seconds).")] = 30.0,
    loglevel: Annotated[str, Opt("--loglevel", "-l", help="DEBUG, INFO, WARNING or ERROR.")
                        ] = "INFO",
) -> None:
    """Run the registrar: the one process that makes cloud machines' Redis users.

    The provisioner (inside `spillway scheduler`) has no ACL right; it asks the registrar for
    each machine's user, and the registrar makes exactly that user, with the agent rules of
    that machine's node and nothing else, after checking the request against the machine's
    instance record. Run one, with the administrator's URL or the user of
    `spillway redis acl --role registrar` (docs/security.md, "Cloud workers").
    """
    import logging
    import signal
    import threading

    from broker.security.redact import install_log_redaction, url_password
    from broker.security.registrar import run_registrar

    logging.basicConfig(level=loglevel.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    s = settings(ctx)
    url = s.url()
    install_log_redaction(extra=[url_password(url)])
    stop = threading.Event()

    def _stop(signum: int, frame: object) -> None:
        del signum, frame
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    err.print(f"spillway registrar on {escape(redacted(url))}")
    raise typer.Exit(run_registrar(url, prefix, sweep_s, stop, s.config.redis_retry_s))
