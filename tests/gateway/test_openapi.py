"""The admin API's OpenAPI description (`kernelfleet.gateway.openapi`) is valid, names every
``/api/fleet`` route and method and nothing else, and live responses of a real gateway match it,
checked by hand and by a bounded schemathesis run."""

import re

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from openapi_schema_validator import OAS30Validator
from openapi_spec_validator import validate as validate_spec
from tornado.web import RequestHandler

from kernelfleet.gateway.handlers import routes
from kernelfleet.gateway.openapi import spec

pytestmark = pytest.mark.timeout(180)

FLEET_PREFIX = "/api/fleet"


def route_template(pattern: str) -> str:
    """A tornado route pattern as an OpenAPI path: groups become ``{name}``, ``/?`` goes."""
    path = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", pattern.removesuffix("/?"))
    return path.replace("\\.", ".")


def implemented_methods(handler: type) -> set[str]:
    return {
        method.lower()
        for method in handler.SUPPORTED_METHODS
        if getattr(handler, method.lower()) is not getattr(RequestHandler, method.lower())
    }


def admin_routes() -> dict[str, set[str]]:
    return {
        route_template(pattern): implemented_methods(handler)
        for pattern, handler in routes()
        if pattern.startswith(FLEET_PREFIX)
    }


def documented(description: dict) -> dict[str, set[str]]:
    methods = {"get", "put", "post", "delete", "patch", "head", "options"}
    return {path: set(item) & methods for path, item in description["paths"].items()}


def test_the_spec_is_valid_openapi_3():
    validate_spec(spec("http://127.0.0.1:8765"))
    assert spec()["openapi"].startswith("3.")
    assert "servers" not in spec()


def test_every_admin_route_and_method_is_in_the_spec_and_nothing_else():
    assert admin_routes() == documented(spec())


# ---- live: a gateway of the test's own, with a replicated kernel -----------------------------


@pytest.fixture(scope="module")
def fleet2(fleet_factory):
    """3 hosts, kernels of 2 replicas: a replica can move to the third host."""
    return fleet_factory(hosts=3, gpus=1, replicas=2)


@pytest.fixture(scope="module")
def kernel(fleet2):
    kernel_id = fleet2.start_kernel()
    yield kernel_id
    fleet2.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


def check(template: str, method: str, status: int, body) -> None:
    """`body` is what the spec says `method` `template` answers with `status`."""
    description = spec()
    responses = description["paths"][template][method]["responses"]
    assert str(status) in responses, f"{method.upper()} {template} answered {status}: {body}"
    schema = responses[str(status)]["content"]["application/json"]["schema"]
    validator = OAS30Validator({**schema, "components": description["components"]})
    errors = [error.message for error in validator.iter_errors(body)]
    assert not errors, f"{method.upper()} {template} {status}: {errors} in {body}"


def test_the_gateway_serves_the_spec_with_itself_as_server(fleet2):
    served = fleet2.api("GET", "/api/fleet/openapi.json")
    assert served["servers"] == [{"url": fleet2.url}]
    assert {**served, "servers": None} == {**spec(fleet2.url), "servers": None}
    check("/api/fleet/openapi.json", "get", 200, served)


def test_live_get_responses_match_the_spec(fleet2, kernel):
    hosts = fleet2.api("GET", "/api/fleet/hosts")
    cases = [
        ("/api/fleet", "/api/fleet", 200),
        ("/api/fleet/hosts", "/api/fleet/hosts", 200),
        ("/api/fleet/hosts/{host_id}", f"/api/fleet/hosts/{hosts[0]['id']}", 200),
        ("/api/fleet/hosts/{host_id}", "/api/fleet/hosts/nope", 404),
        ("/api/fleet/kernels", "/api/fleet/kernels", 200),
        ("/api/fleet/kernels/{kernel_id}", f"/api/fleet/kernels/{kernel}", 200),
        ("/api/fleet/kernels/{kernel_id}", "/api/fleet/kernels/nope", 404),
        ("/api/fleet/openapi.json", "/api/fleet/openapi.json", 200),
        ("/api/fleet/events", "/api/fleet/events", 200),
        ("/api/fleet/events", f"/api/fleet/events?kernel={kernel}&n=5", 200),
        ("/api/fleet/events", "/api/fleet/events?n=0", 400),
        ("/api/fleet/events", "/api/fleet/events?kernel=nope", 404),
    ]
    for template, path, expected in cases:
        for token, status in [(None, expected), ("", 401), ("not-the-token", 403)]:
            got, body = fleet2.request("GET", path, token=token)
            assert got == status, f"GET {path} with token {token!r}: {got} {body}"
            check(template, "get", got, body)


def test_a_host_report_that_is_not_valid_matches_the_spec(fleet2):
    bodies = [
        {},
        {"address": "ftp://x"},
        {"address": "http://x", "gpus": 3},
        {"address": "http://x", "isolation": {"kernel_user": "root", "why": "?"}},
        {"address": "http://x", "isolation": "per-kernel"},
    ]
    for body in bodies:
        status, answer = fleet2.request("PUT", "/api/fleet/hosts/host-9", body)
        assert status == 400, answer
        check("/api/fleet/hosts/{host_id}", "put", status, answer)


def test_live_migrate_responses_match_the_spec(fleet2, kernel):
    template = "/api/fleet/kernels/{kernel_id}/replicas/{replica_id}/migrate"
    view = fleet2.api("GET", f"/api/fleet/kernels/{kernel}")
    used = {replica["host"] for replica in view["replicas"]}
    free = next(h["id"] for h in fleet2.api("GET", "/api/fleet/hosts") if h["id"] not in used)
    moving = view["replicas"][0]["id"]
    path = f"/api/fleet/kernels/{kernel}/replicas/{moving}/migrate"
    cases = [
        (f"/api/fleet/kernels/nope/replicas/{moving}/migrate", {}, None, 404),
        (f"/api/fleet/kernels/{kernel}/replicas/nope/migrate", {}, None, 404),
        (path, {"host": 5}, None, 400),
        (path, [1, 2], None, 400),
        (path, {"host": sorted(used)[0]}, None, 409),
        (path, {}, "", 401),
        (path, {}, "not-the-token", 403),
        (path, {"host": free}, None, 200),
    ]
    for url, body, token, status in cases:
        got, answer = fleet2.request("POST", url, body, token=token)
        assert got == status, f"POST {url} {body}: {got} {answer}"
        check(template, "post", got, answer)
    assert free in {replica["host"] for replica in answer["replicas"]}


def test_schemathesis_finds_no_server_error_and_no_schema_violation(fleet2, kernel):
    """Generated calls of every operation but the hosts' heartbeat (``PUT``: it would register
    hosts that do not exist) and the event stream (a websocket) answer no 5xx and only what the
    spec describes. Bounded: a few examples per operation, no example database."""
    headers = {"Authorization": f"token {fleet2.token}"}
    # as served, calls going to its `servers` (from_url would leave out its own URL)
    served = fleet2.api("GET", "/api/fleet/openapi.json")
    schema = schemathesis.openapi.from_dict(served)
    schema.config.update(base_url=served["servers"][0]["url"])
    checks = [
        schemathesis.checks.not_a_server_error,
        schemathesis.checks.response_schema_conformance,
        schemathesis.checks.status_code_conformance,
        schemathesis.checks.content_type_conformance,
    ]
    stream = "/api/fleet/events/stream"
    included = schema.exclude(method="PUT").exclude(path=stream)
    operations = [result.ok() for result in included.get_all_operations()]
    assert {operation.label for operation in operations} == {
        f"{method.upper()} {path}"
        for path, methods in admin_routes().items()
        for method in methods - {"put"}
        if path != stream
    }
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=15,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        def call(case):
            case.call_and_validate(headers=headers, checks=checks, timeout=30)

        call()
