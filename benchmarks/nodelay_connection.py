"""Configuration B's kernel websocket: jupyter_server's stock local-kernel connection, Nagle off.

jupyter_server leaves Nagle's algorithm on for the browser-facing kernel websocket. The
kernelfleet extension (configuration D) switches it off with one call in ``connect``; this class
makes exactly the same call, and nothing else, for local kernels, so B and D differ only in where
the kernel runs. Selected with
``--ServerApp.kernel_websocket_connection_class=nodelay_connection.NoDelayZMQChannelsWebsocketConnection``
and ``benchmarks/`` on ``PYTHONPATH``.
"""

from __future__ import annotations

import asyncio

from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection

LOG_LINE = "benchmarks: TCP_NODELAY on the local kernel websocket"


class NoDelayZMQChannelsWebsocketConnection(ZMQChannelsWebsocketConnection):
    """The stock ZMQ-backed connection with TCP_NODELAY on the websocket to the client."""

    def connect(self) -> asyncio.Future[None] | None:
        self.websocket_handler.set_nodelay(True)
        self.log.info(LOG_LINE)
        return super().connect()
