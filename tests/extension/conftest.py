import pytest
from jupyter_server.gateway.gateway_client import GatewayClient


@pytest.fixture
def jp_server_config(fleet):
    """A real jupyter_server in gateway mode, pointed at the shared fleet, with our extension."""
    return {
        "ServerApp": {"jpserver_extensions": {"kernelfleet.extension": True}},
        "GatewayClient": {"url": fleet.url, "auth_token": fleet.token, "request_timeout": 60.0},
    }


@pytest.fixture(autouse=True)
def _fresh_gateway_client():
    yield
    GatewayClient.clear_instance()
