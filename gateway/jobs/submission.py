"""The body of ``POST /api/fleet/jobs``, checked: every bad field is `InvalidRequest` naming it."""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kernelfleet.errors import InvalidRequest

MAX_NAME = 200
FIELDS = frozenset({"name", "source", "function", "args", "gpus", "steps", "weight"})


@dataclass(frozen=True)
class Submission:
    gpus: int
    steps: int
    source: str | None
    function: str | None
    args: tuple[str, ...] = ()
    name: str | None = None
    weight: float = 1.0

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Submission:
        unknown = sorted(set(body) - FIELDS)
        if unknown:
            raise InvalidRequest(f"unknown field(s) {', '.join(unknown)}; a job takes "
                                 f"{', '.join(sorted(FIELDS))}")  # fmt: skip
        source, function = body.get("source"), body.get("function")
        if (source is None) == (function is None):
            raise InvalidRequest("give exactly one of 'source' (a script) and 'function'")
        if source is not None and (not isinstance(source, str) or not source.strip()):
            raise InvalidRequest("'source' must be the script's text")
        if function is not None:
            if not isinstance(function, str):
                raise InvalidRequest("'function' must be base64 text")
            try:
                base64.b64decode(function, validate=True)
            except (binascii.Error, ValueError):
                raise InvalidRequest("'function' must be base64 (of a cloudpickle)") from None
        args = body.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise InvalidRequest("'args' must be a list of strings")
        name = body.get("name")
        if name is not None and (not isinstance(name, str) or len(name) > MAX_NAME):
            raise InvalidRequest(f"'name' must be a string of at most {MAX_NAME} characters")
        weight = body.get("weight", 1.0)
        if (
            isinstance(weight, bool)
            or not isinstance(weight, int | float)
            or not math.isfinite(weight)
            or weight <= 0
        ):
            raise InvalidRequest("'weight' must be a number > 0")
        return cls(
            gpus=_positive(body, "gpus"),
            steps=_positive(body, "steps"),
            source=source,
            function=function,
            args=tuple(args),
            name=name or None,
            weight=float(weight),
        )


def _positive(body: Mapping[str, Any], name: str) -> int:
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequest(f"'{name}' must be an integer >= 1, not {value!r}")
    return value
