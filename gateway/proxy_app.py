"""GatewayProxyApp (``kernelfleet gateway-proxy``): one address for a replicated gateway.

Runs a `GatewayProxy` in the foreground: clients (jupyter_server's ``--gateway-url``, host
agents, kernels) are given the proxy's address, and it forwards each of their connections to
whichever gateway member serves. Stops cleanly on SIGINT and SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import urllib.parse
from pathlib import Path
from typing import cast

from traitlets import Float, Int, List, TraitError, Unicode, default, validate
from traitlets.config import Application, catch_config_error

from kernelfleet import __version__
from kernelfleet.gateway.proxy import GatewayProxy
from kernelfleet.privileges import mark_non_dumpable
from kernelfleet.runtime_file import GatewayRuntime, remove_runtime, write_runtime

log = logging.getLogger("kernelfleet.gateway.proxy")

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def check_member_url(url: str) -> str:
    """`url` without a trailing slash, if it is an http(s) URL of a host (and port) and
    nothing else; raises `TraitError` naming it otherwise."""
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # raises for a port that is not a number or out of range
    except ValueError as e:
        raise TraitError(f"--members: {url!r} is not a valid URL ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TraitError(f"--members: {url!r} is not an http(s) URL such as http://gw1:8765")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise TraitError(
            f"--members: {url!r} must be scheme, host and port only (the proxy forwards whole "
            "connections, so a path or query would not be used)"
        )
    return url.rstrip("/")


class GatewayProxyApp(Application):
    name = "kernelfleet-gateway-proxy"
    version = __version__
    description = (
        "Forward one address to whichever gateway member serves: point clients at the proxy, "
        "and it follows the replicated gateway's leader (docs/gateway-proxy.md)."
    )
    examples = (
        "kernelfleet gateway-proxy --port 8889 "
        "--members http://gw1:8765,http://gw2:8765,http://gw3:8765"
    )

    aliases = {
        "ip": "GatewayProxyApp.ip",
        "port": "GatewayProxyApp.port",
        "members": "GatewayProxyApp.members",
        "token": "GatewayProxyApp.token",
        "probe-interval": "GatewayProxyApp.probe_interval",
        "probe-timeout": "GatewayProxyApp.probe_timeout",
        "connect-wait": "GatewayProxyApp.connect_wait",
        "state-dir": "GatewayProxyApp.state_dir",
        "log-level": "Application.log_level",
    }

    ip = Unicode(
        "127.0.0.1", config=True, help="Address to listen on (loopback unless configured)."
    )
    port = Int(8889, config=True, help="Port to listen on (0 picks a free one).")
    members = List(
        Unicode(),
        config=True,
        help="The gateway members' URLs (http(s)://host:port), comma separated or the option "
        "repeated. Required.",
    )
    token = Unicode(
        config=True,
        help="The fleet token, sent with every probe of a member. Default: $KERNELFLEET_TOKEN. "
        "Required.",
    )
    probe_interval = Float(
        0.25, config=True, help="Seconds between probe rounds (each probes every member)."
    )
    probe_timeout = Float(
        1.0,
        config=True,
        help="Seconds a probe (and a connection to the serving member) may take; a member that "
        "does not answer within it does not serve.",
    )
    connect_wait = Float(
        10.0,
        config=True,
        help="Seconds a connection waits for a member to serve before it is answered 503.",
    )
    state_dir = Unicode(
        "",
        config=True,
        help="A folder to write runtime.json in while the proxy listens (url, port, pid), so "
        "that its port can be found with --port 0. Default: none written.",
    )

    @default("log_level")
    def _default_log_level(self) -> int:
        return logging.INFO

    @default("token")
    def _default_token(self) -> str:
        return os.environ.get("KERNELFLEET_TOKEN", "")

    @validate("token")
    def _check_token(self, proposal: dict) -> str:
        if not proposal["value"]:
            raise TraitError("a token is required: --token, or $KERNELFLEET_TOKEN")
        if len(proposal["value"]) < 8:
            raise TraitError("the token must be at least 8 characters long")
        return proposal["value"]

    @validate("members")
    def _check_members(self, proposal: dict) -> list[str]:
        urls = [url.strip() for value in proposal["value"] for url in value.split(",")]
        return [check_member_url(url) for url in urls if url]

    @validate("probe_interval", "probe_timeout", "connect_wait")
    def _check_positive(self, proposal: dict) -> float:
        if proposal["value"] <= 0:
            raise TraitError(f"{proposal['trait'].name} must be > 0, not {proposal['value']}")
        return proposal["value"]

    @validate("port")
    def _check_port(self, proposal: dict) -> int:
        if not 0 <= proposal["value"] <= 65535:
            raise TraitError(f"port {proposal['value']} is out of range")
        return proposal["value"]

    @catch_config_error
    def initialize(self, argv: list[str] | None = None) -> None:
        super().initialize(argv)
        self.check_required()
        mark_non_dumpable()  # it holds the fleet token, as the gateway does
        self.init_logging()
        self.init_state_dir()

    def init_logging(self) -> None:
        level = cast(int, self.log_level)
        logging.basicConfig(level=level, format=LOG_FORMAT)
        logging.getLogger("kernelfleet").setLevel(level)

    def check_required(self) -> None:
        """Raise `TraitError` for what a proxy cannot run without: members and a token (an
        unset or short $KERNELFLEET_TOKEN too), and for stray arguments (members given with
        spaces instead of commas)."""
        if self.extra_args:
            raise TraitError(
                f"unexpected arguments: {' '.join(self.extra_args)} "
                "(separate the members with commas: --members URL,URL,URL)"
            )
        if not self.members:
            raise TraitError("--members is required: the gateway members' URLs, comma separated")
        self.token = self.token  # traitlets does not validate a default: this does

    def init_state_dir(self) -> None:
        """Create the folder of the runtime file, if one is asked for."""
        if self.state_dir:
            Path(self.state_dir).mkdir(parents=True, exist_ok=True)

    def local_url(self) -> str:
        """The URL a process on this machine reaches the proxy at (loopback for a wildcard
        ``ip``); known once it listens."""
        address = "127.0.0.1" if self.ip in ("", "0.0.0.0") else self.ip
        if ":" in address:
            address = "[::1]" if address == "::" else f"[{address}]"
        return f"http://{address}:{self.port}"

    async def serve(self) -> int:
        """Listen and forward until SIGINT or SIGTERM; returns the exit code (2: it could not
        listen)."""
        proxy = GatewayProxy(
            self.members,
            self.token,
            probe_interval=self.probe_interval,
            probe_timeout=self.probe_timeout,
            connect_wait=self.connect_wait,
        )
        try:
            self.port = await proxy.start(self.ip, self.port)
        except OSError as e:
            log.critical("cannot listen on %s:%d: %s", self.ip, self.port, e)
            await proxy.close()
            return 2
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        log.info(
            "gateway proxy listening on http://%s:%d, members: %s",
            self.ip,
            self.port,
            ", ".join(self.members),
        )
        if self.state_dir:
            write_runtime(self.state_dir, GatewayRuntime(self.local_url(), self.port, os.getpid()))
        await stop.wait()
        log.info("gateway proxy stopping")
        if self.state_dir:
            remove_runtime(self.state_dir)
        await proxy.close()
        return 0

    def start(self) -> None:
        code = asyncio.run(self.serve())
        if code:
            self.exit(code)


main = GatewayProxyApp.launch_instance
