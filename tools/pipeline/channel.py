"""The link between a run's driver (the notebook) and its workers: TCP, one connection each.

The driver listens on a TCP address; each worker connects to it and, before anything is
unpickled on either side, sends the run's secret token, which the driver compares in constant
time. Messages are then pickled objects, framed by ``multiprocessing.connection``; the driver
pickles with cloudpickle, so that models and loss functions defined in the notebook travel by
value. Every wait has a timeout. (A TCP address rather than a pipe, so that workers run on other
hosts of the fleet too: the driver then listens on its host's address, `runner.WorkerPool`.)
"""

from __future__ import annotations

import hmac
import pickle
import socket
from multiprocessing.connection import Connection
from typing import Any

TOKEN_ENV = "KERNELFLEET_PIPELINE_TOKEN"
"""The environment variable that hands a worker the run's token (never on its command line)."""


class ChannelTimeout(TimeoutError):
    """Nothing arrived within the timeout."""


class Channel:
    """One end of a driver-worker connection: `send` an object, `receive` one with a timeout."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def send(self, message: Any) -> None:
        import cloudpickle

        self.connection.send_bytes(cloudpickle.dumps(message))

    def receive(self, timeout: float) -> Any:
        """The next message; `ChannelTimeout` after ``timeout`` s, ``EOFError`` if the other
        end closed."""
        if not self.connection.poll(timeout):
            raise ChannelTimeout(f"nothing received in {timeout:g} s")
        return pickle.loads(self.connection.recv_bytes())

    def fileno(self) -> int:
        return self.connection.fileno()

    def close(self) -> None:
        self.connection.close()


def connect(host: str, port: int, token: str, timeout: float) -> Channel:
    """A worker's connection to the driver at ``host:port``, introduced by ``token``."""
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.settimeout(None)
    channel = Channel(Connection(sock.detach()))
    channel.connection.send_bytes(token.encode())
    return channel


class Listener:
    """The driver's side: a TCP socket on `host` (an address the workers reach: ``127.0.0.1``
    for workers on this host only) that accepts workers presenting the run's token."""

    def __init__(self, token: str, host: str = "127.0.0.1") -> None:
        self.token = token.encode()
        self.socket = socket.create_server((host, 0))
        self.host, self.port = self.socket.getsockname()[:2]

    def accept(self, timeout: float) -> Channel:
        """The next worker that presents the token; `ChannelTimeout` if none within
        ``timeout`` s, ``PermissionError`` for a wrong token."""
        self.socket.settimeout(timeout)
        try:
            sock, _ = self.socket.accept()
        except TimeoutError:
            raise ChannelTimeout(f"no worker connected in {timeout:g} s") from None
        sock.settimeout(None)
        connection = Connection(sock.detach())
        try:
            presented = connection.recv_bytes(256) if connection.poll(timeout) else b""
        except (OSError, EOFError):  # longer than any token, or closed
            presented = b""
        if not hmac.compare_digest(presented, self.token):
            connection.close()
            raise PermissionError("a connection without the run's token")
        return Channel(connection)

    def close(self) -> None:
        self.socket.close()
