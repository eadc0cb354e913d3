"""The extension's tests run jupyter_server in gateway mode as the gateway tests do."""

from tests.gateway.conftest import _fresh_gateway_client, jp_server_config

__all__ = ["_fresh_gateway_client", "jp_server_config"]
