"""Running the API on uvicorn: TLS when a certificate and key are given, refusing to serve
tokens in clear text to the network unless told to (behind a proxy that terminates TLS)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from broker.api.remote import is_loopback
from broker.errors import ConfigError

REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


@dataclass(frozen=True)
class ServeOptions:
    redis_url: str
    host: str = "127.0.0.1"
    port: int = 8443
    certfile: Path | None = None
    keyfile: Path | None = None
    config_path: Path | None = None
    submit_rate: float = 50.0  # jobs a second per token
    submit_burst: int = 5000  # jobs at once: a sweep of thousands in one batch
    workers: int = 1
    long_polls: int | None = None  # a token's open waits and log follows (None: the variable
    #                                SPILLWAY_API_LONG_POLLS, else 8)
    insecure_http: bool = False  # plain http on a non-loopback address (a TLS proxy in front)
    log_level: str = "info"

    def check(self) -> None:
        """ConfigError naming the option for anything that cannot work."""
        if not self.redis_url.startswith(REDIS_SCHEMES):
            raise ConfigError(f"--redis-url: the API server needs the cluster's Redis "
                              f"(redis://, rediss:// or unix://), not {self.redis_url!r}")
        if (self.certfile is None) != (self.keyfile is None):
            raise ConfigError("--cert and --key go together: give both for TLS, or neither")
        for opt, path in (("--cert", self.certfile), ("--key", self.keyfile)):
            if path is not None and not path.is_file():
                raise ConfigError(f"{opt}: {path} is not a readable file")
        if self.certfile is None and not is_loopback(self.host) and not self.insecure_http:
            raise ConfigError(f"--host {self.host} without --cert/--key would send tokens in "
                              "clear text over the network; give a certificate and key, bind "
                              "127.0.0.1, or pass --insecure-http behind a TLS-terminating proxy")
        if not 0 < self.port < 65536:
            raise ConfigError(f"--port: {self.port} is not a TCP port (1-65535)")
        if self.submit_rate <= 0 or self.submit_burst < 1:
            raise ConfigError("--submit-rate must be positive and --submit-burst at least 1")
        if self.workers < 1:
            raise ConfigError("--workers must be at least 1")
        self.long_polls_cap()

    def long_polls_cap(self) -> int:
        """The cap on a token's open long polls; ConfigError naming what set it badly."""
        from broker.api.longpoll import check_cap, long_polls_from

        if self.long_polls is not None:
            return check_cap(self.long_polls, "--long-polls")
        return long_polls_from(os.environ)


def serve(opts: ServeOptions) -> None:
    """Serve until SIGTERM or SIGINT (uvicorn's graceful shutdown: requests in flight end)."""
    opts.check()
    try:
        import uvicorn
    except ImportError:
        raise ConfigError("the API server needs the api extra: pip install 'spillway[api]'"
                          ) from None
    os.environ["SPILLWAY_REDIS_URL"] = opts.redis_url  # read by each worker's app factory
    os.environ["SPILLWAY_API_SUBMIT_RATE"] = repr(opts.submit_rate)
    os.environ["SPILLWAY_API_SUBMIT_BURST"] = str(opts.submit_burst)
    os.environ["SPILLWAY_API_LONG_POLLS"] = str(opts.long_polls_cap())
    if opts.config_path is not None:
        os.environ["SPILLWAY_CONFIG"] = str(opts.config_path)
    uvicorn.run("broker.api.app:from_env", factory=True, host=opts.host, port=opts.port,
                workers=opts.workers, log_level=opts.log_level, server_header=False,
                ssl_certfile=str(opts.certfile) if opts.certfile else None,
                ssl_keyfile=str(opts.keyfile) if opts.keyfile else None,
                timeout_graceful_shutdown=10)
