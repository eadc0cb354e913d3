"""The event stream through the server extension: a browser user sees the events of this
jupyter_server's kernels and fleet-wide events, never another server's kernel's."""

from __future__ import annotations

import asyncio
import json

import pytest
from tornado.httpclient import HTTPClientError

from kernelfleet.testing import V1_PROTOCOL, Fleet, KernelWebsocket

pytestmark = pytest.mark.timeout(120)


async def read_until(ws, done, timeout: float = 60) -> list[dict]:
    seen: list[dict] = []

    async def reading() -> None:
        while True:
            message = await ws.read_message()
            assert message is not None, f"the stream closed; seen {seen}"
            seen.append(json.loads(message))
            if done(seen[-1]):
                return

    await asyncio.wait_for(reading(), timeout)
    return seen


async def test_only_this_servers_kernels_and_fleet_events(
    jp_fetch, jp_ws_fetch, fleet: Fleet
) -> None:
    events = await jp_ws_fetch("kernelfleet", "api", "events")
    response = await jp_fetch("api", "kernels", method="POST", body='{"name": "python3"}')
    ours = json.loads(response.body)["id"]
    other = fleet.api("POST", "/api/kernels", {"name": "python3"}, expect=201)["id"]
    try:
        fleet.api("DELETE", f"/api/kernels/{other}", expect=204)
        channels = await jp_ws_fetch(
            "api", "kernels", ours, "channels", params={"session_id": "t"},
            subprotocols=[V1_PROTOCOL],
        )  # fmt: skip
        kernel = KernelWebsocket(channels)
        assert (await kernel.execute("print('hi')")).stdout == "hi\n"
        kernel.close()
        seen = await read_until(
            events, lambda e: e["type"] == "cell-finished" and e["kernel_id"] == ours
        )
        assert all(e["kernel_id"] in (None, ours) for e in seen), seen
        assert "cell-started" in [e["type"] for e in seen if e["kernel_id"] == ours]
        seqs = [e["seq"] for e in seen]
        assert seqs == sorted(seqs)

        # Reconnecting with `since` replays what followed, still filtered.
        again = await jp_ws_fetch("kernelfleet", "api", "events", params={"since": seqs[0]})
        replayed = await read_until(again, lambda e: e["seq"] == seqs[-1])
        assert [e["seq"] for e in replayed] == seqs[1:]
        again.close()
    finally:
        events.close()
        await jp_fetch("api", "kernels", ours, method="DELETE")


async def test_the_kernel_filter_is_checked_against_this_server(
    jp_fetch, jp_ws_fetch, fleet: Fleet
) -> None:
    other = fleet.api("POST", "/api/kernels", {"name": "python3"}, expect=201)["id"]
    try:
        with pytest.raises(HTTPClientError) as error:
            await jp_ws_fetch("kernelfleet", "api", "events", params={"kernel": other})
        assert error.value.code == 404
        with pytest.raises(HTTPClientError) as error:
            await jp_ws_fetch("kernelfleet", "api", "events", params={"since": "yesterday"})
        assert error.value.code == 400
    finally:
        fleet.api("DELETE", f"/api/kernels/{other}", expect=204)
