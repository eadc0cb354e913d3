"""The small builders every part of the admin API's OpenAPI description is written with
(`kernelfleet.gateway.openapi` and the parts it merges in)."""

from __future__ import annotations

from typing import Any

INT = {"type": "integer", "minimum": 0}
STRINGS = {"type": "array", "items": {"type": "string"}}


def ref(name: str) -> dict[str, str]:
    """A reference to the component schema `name`."""
    return {"$ref": f"#/components/schemas/{name}"}


def closed_object(properties: dict[str, Any], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """A closed JSON object: every property required but the `optional` ones."""
    schema = {"type": "object", "properties": properties, "additionalProperties": False}
    required = [name for name in properties if name not in optional]
    if required:  # OpenAPI 3.0 forbids an empty list
        schema["required"] = required
    return schema


def json_response(schema: dict[str, Any], description: str) -> dict[str, Any]:
    """A response (or request body) of JSON with `schema`."""
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def error_response(description: str) -> dict[str, Any]:
    """An error response: the gateway's ``{"reason", "message"}``."""
    return json_response(ref("Error"), description)
