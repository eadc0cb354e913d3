"""One HTTP call to a token-protected JSON API (the gateway's, jupyter_server's), for tests."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def call_json(
    url: str, method: str = "GET", token: str = "", body: Any = None, timeout: float = 60
) -> tuple[int, Any]:
    """`method` `url` with ``Authorization: token <token>`` (none for ``""``) and `body` as
    JSON; returns (status, the parsed JSON body or None). A 4xx or 5xx answer is returned, not
    raised; no answer at all (refused, timed out) raises ``OSError``."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"token {token}"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    return int(status), (json.loads(raw) if raw else None)
