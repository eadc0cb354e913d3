"""``kernelfleet bridge``: a local process that looks like a plain ZMQ kernel to jupyter_client
and relays everything to a kernel of a kernelfleet gateway, over its websocket.

jupyter_client starts it from a kernelspec (``kernelfleet bridge install`` writes one) with
``-f CONNECTION_FILE``. The bridge binds the file's five ports (shell, control, stdin: ROUTER;
IOPub: PUB; heartbeat: REP, echoed), creates a kernel on the gateway (``POST /api/kernels``)
and opens its channels websocket (v1 framing). Each message a client sends is checked against
the file's key and relayed as is; each message from the gateway is signed with that key and
sent to the client that asked (replies and input requests go back to the ZMQ identity of the
request they answer; IOPub to every subscriber). Any jupyter_client tool then reaches the fleet:
nbclient or papermill by kernel name, ``jupyter console --kernel``, VS Code.

Lifetime: the gateway kernel is shut down (``DELETE /api/kernels/{id}``) when a client's
``shutdown_request`` has been answered, on SIGTERM, and whenever the bridge exits otherwise;
SIGINT interrupts it. jupyter_client kills a kernel's process group with SIGKILL when it
shuts it down "now" (its tests do, at every end): for that, a reaper process of the bridge, in
a session of its own, waits for the bridge's end (its stdin closes) and deletes the kernel
unless the bridge said it did. The websocket that the gateway closes for a reconnect (a
relink) is reopened; a kernel the gateway no longer has ends the bridge.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio
from jupyter_client.session import Session
from jupyter_core.paths import jupyter_data_dir
from jupyter_server.services.kernels.connection.base import (
    deserialize_msg_from_ws_v1,
    serialize_msg_to_ws_v1,
)
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect
from traitlets import Float, Unicode, default
from traitlets.config import Application

from kernelfleet import __version__

log = logging.getLogger("kernelfleet.bridge")

V1_PROTOCOL = "v1.kernel.websocket.jupyter.org"
DELIMITER = b"<IDS|MSG>"
ROUTED = ("shell", "control", "stdin")
IDENTS_KEPT = 4096
"""Requests whose client identity is remembered, to route their replies and input requests."""
TOKEN_ENV = "KERNELFLEET_TOKEN"
REAPER_DONE = b"deleted\n"
"""What the bridge writes to its reaper's stdin once it deleted the kernel itself."""
URL_ENV = "KERNELFLEET_URL"


class BridgeError(Exception):
    """The bridge cannot serve: the gateway refused or vanished. `reason` names the case."""

    def __init__(self, message: str, reason: str = "bridge-failed") -> None:
        super().__init__(message)
        self.reason = reason


class Bridge:
    """One gateway kernel behind one connection file's ports; see the module docstring."""

    def __init__(
        self,
        connection: dict[str, Any],
        gateway_url: str,
        token: str,
        kernel_name: str,
        request_timeout: float,
    ) -> None:
        self.connection = connection
        self.gateway_url = gateway_url.rstrip("/")
        self.token = token
        self.kernel_name = kernel_name
        self.request_timeout = request_timeout
        self.session = Session(
            key=str(connection.get("key", "")).encode(),
            signature_scheme=connection.get("signature_scheme", "hmac-sha256"),
            username="kernelfleet-bridge",
        )
        self.kernel_id: str | None = None
        self.context = zmq.asyncio.Context()
        self.sockets: dict[str, zmq.asyncio.Socket] = {}
        self.idents: dict[str, list[bytes]] = {}  # request msg_id -> its client's identities
        self.ws: WebSocketClientConnection | None = None
        self.stopping = asyncio.Event()
        self._shutdown_asked: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._reaper: subprocess.Popen[bytes] | None = None

    # ---- lifetime ------------------------------------------------------------------------

    async def run(self) -> None:
        """Bind, create the gateway kernel, relay until told to stop; always delete it."""
        self._bind()
        try:
            self.kernel_id = await self._create_kernel()
            self._start_reaper(self.kernel_id)
            log.info("bridge relays to kernel %s on %s", self.kernel_id, self.gateway_url)
            self.ws = await self._connect()
            self._tasks = [asyncio.create_task(self._from_clients(channel)) for channel in ROUTED]
            self._tasks.append(asyncio.create_task(self._heartbeat()))
            self._tasks.append(asyncio.create_task(self._from_gateway()))
            await self.stopping.wait()
        finally:
            for task in self._tasks:
                task.cancel()
            if self.ws is not None:
                self.ws.close()
            await self._delete_kernel()
            for socket in self.sockets.values():
                socket.close(linger=0)
            self.context.term()

    def stop(self) -> None:
        self.stopping.set()

    async def interrupt(self) -> None:
        """Interrupt the gateway kernel (SIGINT, as a kernel takes it in signal mode)."""
        if self.kernel_id is None:
            return
        try:
            path = f"/api/kernels/{self.kernel_id}/interrupt"
            await AsyncHTTPClient().fetch(self._request(path, "POST", {}))
        except (HTTPClientError, OSError) as e:
            log.error("kernel %s could not be interrupted: %s", self.kernel_id, e)

    def _bind(self) -> None:
        kinds = {
            "shell": zmq.ROUTER,
            "control": zmq.ROUTER,
            "stdin": zmq.ROUTER,
            "iopub": zmq.PUB,
            "hb": zmq.REP,
        }
        transport = self.connection.get("transport", "tcp")
        ip = self.connection.get("ip", "127.0.0.1")
        for channel, kind in kinds.items():
            socket = self.context.socket(kind)
            socket.setsockopt(zmq.LINGER, 1000)
            port = self.connection[f"{channel}_port"]
            if transport == "tcp":
                socket.bind(f"tcp://{ip}:{port}")
            else:
                socket.bind(f"ipc://{ip}-{port}")
            self.sockets[channel] = socket

    # ---- the gateway's HTTP API ----------------------------------------------------------

    def _request(self, path: str, method: str, body: Any = None) -> HTTPRequest:
        return HTTPRequest(
            self.gateway_url + path,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
            body=None if body is None else json.dumps(body),
            request_timeout=self.request_timeout,
        )

    async def _create_kernel(self) -> str:
        request = self._request("/api/kernels", "POST", {"name": self.kernel_name})
        try:
            response = await AsyncHTTPClient().fetch(request)
        except HTTPClientError as e:
            detail = e.response.body.decode(errors="replace") if e.response else ""
            raise BridgeError(
                f"the gateway at {self.gateway_url} did not start a kernel: {e.code} {detail}",
                "kernel-refused",
            ) from e
        except OSError as e:
            raise BridgeError(
                f"the gateway at {self.gateway_url} cannot be reached: {e}", "gateway-unreachable"
            ) from e
        return str(json.loads(response.body)["id"])

    def _start_reaper(self, kernel_id: str) -> None:
        """Start the process that deletes `kernel_id` if the bridge dies without doing it."""
        self._reaper = subprocess.Popen(
            [sys.executable, "-m", "kernelfleet.bridge", self.gateway_url, kernel_id],
            stdin=subprocess.PIPE,
            env={**os.environ, TOKEN_ENV: self.token},  # not in argv, where ps shows it
            start_new_session=True,  # out of the process group jupyter_client kills
        )

    def _release_reaper(self) -> None:
        reaper, self._reaper = self._reaper, None
        if reaper is not None and reaper.stdin is not None:
            with contextlib.suppress(OSError):
                reaper.stdin.write(REAPER_DONE)
                reaper.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                reaper.wait(5)

    async def _delete_kernel(self) -> None:
        if self.kernel_id is None:
            self._release_reaper()
            return
        kernel_id, self.kernel_id = self.kernel_id, None
        try:
            await AsyncHTTPClient().fetch(self._request(f"/api/kernels/{kernel_id}", "DELETE"))
        except HTTPClientError as e:
            if e.code != 404:  # 404: the gateway shut it down already (a shutdown_request)
                log.error("kernel %s may still run on the gateway: %s", kernel_id, e)
        except OSError as e:
            log.error("kernel %s may still run on the gateway (unreachable: %s)", kernel_id, e)
        else:
            log.info("kernel %s shut down on the gateway", kernel_id)
        self._release_reaper()

    async def _connect(self) -> WebSocketClientConnection:
        ws_url = self.gateway_url.replace("http", "ws", 1)
        request = HTTPRequest(
            f"{ws_url}/api/kernels/{self.kernel_id}/channels?session_id={uuid.uuid4()}",
            headers={"Authorization": f"token {self.token}"},
            request_timeout=self.request_timeout,
        )
        return await websocket_connect(request, subprotocols=[V1_PROTOCOL])

    # ---- relaying ------------------------------------------------------------------------

    async def _from_clients(self, channel: str) -> None:
        """Relay each checked message from the clients on `channel` to the gateway."""
        socket = self.sockets[channel]
        while True:
            frames = [bytes(frame) for frame in await socket.recv_multipart()]
            try:
                split = frames.index(DELIMITER)
                idents, parts = frames[:split], frames[split + 1 :]
                if self.session.auth is not None and parts[0] != self.session.sign(parts[1:5]):
                    raise ValueError("bad HMAC signature")
                header = json.loads(parts[1])
            except (ValueError, IndexError) as e:
                log.error("dropped a client message on %s: %s", channel, e)
                continue
            msg_id = str(header.get("msg_id", ""))
            self.idents[msg_id] = list(idents)
            while len(self.idents) > IDENTS_KEPT:
                self.idents.pop(next(iter(self.idents)))
            if channel == "control" and header.get("msg_type") == "shutdown_request":
                self._shutdown_asked.add(msg_id)
            await self._send_to_gateway(channel, parts[1:])

    async def _send_to_gateway(self, channel: str, parts: list[bytes]) -> None:
        ws = self.ws
        if ws is None:
            log.error("no websocket: dropped a %s message", channel)
            return
        await ws.write_message(serialize_msg_to_ws_v1(parts, channel), binary=True)

    async def _from_gateway(self) -> None:
        """Relay each message from the gateway to its client; reopen a websocket the gateway
        closed for a reconnect; stop when the kernel is gone."""
        while not self.stopping.is_set():
            assert self.ws is not None
            frame = await self.ws.read_message()
            if frame is None:
                if not await self._reconnect():
                    self.stop()
                    return
                continue
            if not isinstance(frame, bytes):
                log.error("dropped a text frame from the gateway (v1 frames are binary)")
                continue
            channel, parts = deserialize_msg_from_ws_v1(frame)
            self._to_client(channel, [bytes(p) for p in parts])

    def _to_client(self, channel: str, parts: list[bytes]) -> None:
        header, parent = json.loads(parts[0]), json.loads(parts[1])
        parent_id = str(parent.get("msg_id", "")) if isinstance(parent, dict) else ""
        signature = self.session.sign(parts[:4])
        if channel == "iopub":
            topic = f"kernel.{self.kernel_id}.{header.get('msg_type', '')}".encode()
            self.sockets["iopub"].send_multipart([topic, DELIMITER, signature, *parts])
            return
        idents = self.idents.get(parent_id)
        if channel not in ROUTED or idents is None:
            log.debug("dropped a %s message answering no client request", channel)
            return
        self.sockets[channel].send_multipart([*idents, DELIMITER, signature, *parts])
        if channel == "control" and parent_id in self._shutdown_asked:
            self.stop()  # answered: the gateway stops the kernel, and the bridge ends

    async def _reconnect(self) -> bool:
        """A new websocket to the same kernel; False if the gateway no longer has it."""
        for _ in range(int(self.request_timeout)):
            try:
                self.ws = await self._connect()
                return True
            except HTTPClientError as e:
                if e.code == 404:
                    log.error("kernel %s is gone from the gateway", self.kernel_id)
                    self.kernel_id = None
                    return False
            except OSError:
                pass
            await asyncio.sleep(1)
        return False

    async def _heartbeat(self) -> None:
        socket = self.sockets["hb"]
        while True:
            await socket.send_multipart(await socket.recv_multipart())


def read_connection_file(path: str) -> dict[str, Any]:
    try:
        info = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        why = f"cannot read the connection file {path}: {e}"
        raise BridgeError(why, "bad-connection-file") from e
    missing = [f"{c}_port" for c in (*ROUTED, "iopub", "hb") if f"{c}_port" not in info]
    if missing:
        raise BridgeError(f"the connection file {path} lacks {', '.join(missing)}")
    return dict(info)


class BridgeInstallApp(Application):
    """``kernelfleet bridge install``: write a kernelspec that starts a bridge."""

    name = "kernelfleet-bridge-install"
    version = __version__
    description = (
        "Write a Jupyter kernelspec whose kernels run on a kernelfleet gateway, through "
        "'kernelfleet bridge'. The token is read from $KERNELFLEET_TOKEN (or --token) and kept "
        "in the kernelspec's env, in a file only its owner can read."
    )
    aliases = {
        "gateway-url": "BridgeInstallApp.gateway_url",
        "name": "BridgeInstallApp.kernel_spec_name",
        "display-name": "BridgeInstallApp.display_name",
        "kernel-name": "BridgeInstallApp.kernel_name",
        "token": "BridgeInstallApp.token",
        "prefix": "BridgeInstallApp.prefix",
    }

    gateway_url = Unicode(config=True, help="The gateway's URL. Default: $KERNELFLEET_URL.")
    kernel_spec_name = Unicode("kernelfleet", config=True, help="The kernelspec's name.")
    display_name = Unicode(config=True, help="Its name in menus. Default: 'Python (kernelfleet)'.")
    kernel_name = Unicode("python3", config=True, help="The gateway kernelspec to start.")
    token = Unicode(config=True, help="The fleet token. Default: $KERNELFLEET_TOKEN.")
    prefix = Unicode(
        config=True,
        help="Install under PREFIX/share/jupyter/kernels; default: the user's Jupyter data dir.",
    )

    @default("gateway_url")
    def _default_url(self) -> str:
        return os.environ.get(URL_ENV, "")

    @default("token")
    def _default_token(self) -> str:
        return os.environ.get(TOKEN_ENV, "")

    @default("display_name")
    def _default_display_name(self) -> str:
        return "Python (kernelfleet)"

    def spec_dir(self) -> Path:
        root = Path(self.prefix, "share", "jupyter") if self.prefix else Path(jupyter_data_dir())
        return root / "kernels" / self.kernel_spec_name

    def start(self) -> None:
        if not self.gateway_url:
            print("kernelfleet bridge install: --gateway-url is required", file=sys.stderr)
            self.exit(2)
        argv = [sys.executable, "-m", "kernelfleet", "bridge", "-f", "{connection_file}"]
        argv += ["--gateway-url", self.gateway_url, "--kernel-name", self.kernel_name]
        spec = {
            "argv": argv,
            "display_name": self.display_name,
            "language": "python",
            "interrupt_mode": "message",
            "env": {TOKEN_ENV: self.token} if self.token else {},
            "metadata": {"kernelfleet": {"gateway_url": self.gateway_url}},
        }
        folder = self.spec_dir()
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(stat.S_IRWXU)
        path = folder / "kernel.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # an older file's mode too
        with os.fdopen(fd, "w") as file:
            json.dump(spec, file, indent=2)
        print(f"Installed kernelspec {self.kernel_spec_name} in {folder}")
        if not self.token:
            print(f"No token stored: the bridge reads ${TOKEN_ENV} when it starts.")


class BridgeApp(Application):
    """``kernelfleet bridge -f CONNECTION_FILE --gateway-url URL``; see the module docstring."""

    name = "kernelfleet-bridge"
    version = __version__
    description = "Relay a ZMQ kernel connection file to a kernel of a kernelfleet gateway."
    aliases = {
        "f": "BridgeApp.connection_file",
        "gateway-url": "BridgeApp.gateway_url",
        "token": "BridgeApp.token",
        "kernel-name": "BridgeApp.kernel_name",
    }
    subcommands = {
        "install": (
            "kernelfleet.bridge.BridgeInstallApp",
            "Write a kernelspec that runs its kernels on a gateway through the bridge.",
        ),
    }

    connection_file = Unicode(config=True, help="The kernel connection file to serve.")
    gateway_url = Unicode(config=True, help="The gateway's URL. Default: $KERNELFLEET_URL.")
    token = Unicode(config=True, help="The fleet token. Default: $KERNELFLEET_TOKEN.")
    kernel_name = Unicode("python3", config=True, help="The gateway kernelspec to start.")
    request_timeout = Float(
        120.0, config=True, help="Seconds a gateway request (a kernel start) may take."
    )

    @default("gateway_url")
    def _default_url(self) -> str:
        return os.environ.get(URL_ENV, "")

    @default("token")
    def _default_token(self) -> str:
        return os.environ.get(TOKEN_ENV, "")

    def start(self) -> None:
        if self.subapp is not None:
            self.subapp.start()
            return
        if not self.connection_file or not self.gateway_url:
            print("kernelfleet bridge: -f and --gateway-url are required", file=sys.stderr)
            self.exit(2)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s bridge: %(message)s")
        try:
            asyncio.run(self._serve())
        except BridgeError as e:
            print(f"kernelfleet bridge: {e}", file=sys.stderr)
            self.exit(1)

    async def _serve(self) -> None:
        bridge = Bridge(
            read_connection_file(self.connection_file),
            self.gateway_url,
            self.token,
            self.kernel_name,
            self.request_timeout,
        )
        loop = asyncio.get_running_loop()
        interrupts: set[asyncio.Future[None]] = set()

        def interrupt() -> None:
            interrupts.add(asyncio.ensure_future(bridge.interrupt()))

        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signal.SIGTERM, bridge.stop)
            loop.add_signal_handler(signal.SIGINT, interrupt)
        await bridge.run()


def reap(gateway_url: str, kernel_id: str) -> None:
    """The reaper (``python -m kernelfleet.bridge URL KERNEL_ID``): wait until the bridge ends
    (stdin closes), then delete the gateway kernel unless the bridge wrote `REAPER_DONE`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if REAPER_DONE in sys.stdin.buffer.read():
        return
    request = urllib.request.Request(
        f"{gateway_url.rstrip('/')}/api/kernels/{kernel_id}",
        method="DELETE",
        headers={"Authorization": f"token {os.environ.get(TOKEN_ENV, '')}"},
    )
    try:
        urllib.request.urlopen(request, timeout=60).close()
    except urllib.error.HTTPError as e:
        if e.code != 404:
            print(f"kernelfleet bridge: kernel {kernel_id} may still run: {e}", file=sys.stderr)
    except OSError as e:
        print(f"kernelfleet bridge: kernel {kernel_id} may still run: {e}", file=sys.stderr)


if __name__ == "__main__":
    reap(*sys.argv[1:3])
