"""What the magics show: the gateway's JSON models as small HTML tables and as plain text.

Each function takes the model the admin API answered (`kernelfleet.client.FleetClient`'s
return values) and returns a `View`: JupyterLab renders its ``_repr_html_`` (plain tables,
which JupyterLab's own stylesheet styles, light or dark; colours only through its ``--jp-*``
variables), and every other frontend its ``__repr__``. A field the gateway does not send
(an older gateway) is left out, never an error. Pure functions: no I/O.
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

NOTE_STYLE = "color: var(--jp-ui-font-color2, #616161); margin: 0.2em 0 0.5em 0"
TITLE_STYLE = "margin: 0.2em 0"


@dataclass(frozen=True)
class Section:
    """A titled block: a note line and a table (either may be empty; a table without a
    header is a list of label/value rows)."""

    title: str
    note: str = ""
    header: tuple[str, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()


class View:
    """Sections shown as HTML (``_repr_html_``) and as text (``__repr__``)."""

    def __init__(self, *sections: Section) -> None:
        self.sections = sections

    def _repr_html_(self) -> str:
        parts = ['<div class="kernelfleet-view">']
        for section in self.sections:
            parts.append(f'<p style="{TITLE_STYLE}"><strong>{_e(section.title)}</strong></p>')
            if section.note:
                parts.append(f'<p style="{NOTE_STYLE}">{_e(section.note)}</p>')
            if section.header or section.rows:
                parts.append(_table(section.header, section.rows))
        parts.append("</div>")
        return "\n".join(parts)

    def __repr__(self) -> str:
        blocks = []
        for section in self.sections:
            lines = [section.title]
            if section.note:
                lines.append(section.note)
            if section.header or section.rows:
                lines += _text_table(section.header, section.rows)
            blocks.append("\n".join(lines))
        return "\n\n".join(blocks)


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    head = "".join(f"<th>{_e(cell)}</th>" for cell in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{_e(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    thead = f"<thead><tr>{head}</tr></thead>" if header else ""
    return f"<table>{thead}<tbody>{body}</tbody></table>"


def _text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = [header] if header else []
    widths = [max(len(str(c[i])) for c in [*lines, *rows]) for i in range(len((lines or rows)[0]))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return [*(line(cells) for cells in [*lines, *rows])] + ([] if rows else ["(none)"])


def seconds(value: Any) -> str:
    """A duration for people: ``42 ms``, ``13.1 s``, ``2 min 5 s``; ``-`` when unknown."""
    if not isinstance(value, int | float):
        return "-"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    return f"{int(value // 60)} min {int(value % 60)} s"


def counted(count: int, noun: str) -> str:
    """``1 host``, ``3 hosts``: `noun` with a plain English plural."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def gpus_phrase(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


def devices_text(devices: Iterable[Any]) -> str:
    return ", ".join(str(d) for d in devices) or "-"


def kernel_view(model: dict[str, Any], now: float | None = None) -> View:
    """``%fleet``: the kernel's replicas (host, state, the executor, GPUs bound), its GPU
    count per cell, and its last cells' start delays and why they waited."""
    held = {h.get("host"): list(h.get("devices", [])) for h in model.get("gpus_held") or []}
    executor = model.get("executor")
    rows = tuple(
        (
            str(r.get("id", "")),
            str(r.get("host", "")),
            str(r.get("state", "")),
            "executor" if r.get("id") == executor else "",
            devices_text(held.get(r.get("host"), [])),
        )
        for r in model.get("replicas", [])
    )
    replicas = Section(
        f"kernel {model.get('id', '?')} · {model.get('name', '?')}",
        _kernel_note(model, held, now),
        ("replica", "host", "state", "role", "GPUs bound"),
        rows,
    )
    sections = [replicas]
    degraded = degraded_section(model.get("degraded"), now)
    if degraded is not None:
        sections.insert(0, degraded)
    cells = model.get("recent_cells")
    if cells is not None:
        sections.append(cells_section(cells))
    return View(*sections)


def degraded_section(degraded: Any, now: float | None = None) -> Section | None:
    """``degraded: 2 of 3 replicas - <reason>`` and since when, for a kernel missing a
    replica (the model's ``degraded``); None for a whole kernel (null, or an older gateway)."""
    if not isinstance(degraded, dict):
        return None
    live, wanted = degraded.get("live_replicas", "?"), degraded.get("wanted_replicas", "?")
    note = ""
    since = degraded.get("since")
    if isinstance(since, int | float):
        note = f"for {seconds((now or time.time()) - since)}; the kernel runs on meanwhile"
    title = f"degraded: {live} of {wanted} replicas - {degraded.get('reason') or 'unknown cause'}"
    return Section(title, note)


def _kernel_note(model: dict[str, Any], held: dict[Any, list[Any]], now: float | None) -> str:
    parts = []
    for key in ("notebook_path", "user"):
        if model.get(key):
            parts.append(str(model[key]))
    if isinstance(model.get("gpus"), int):
        parts.append(f"{gpus_phrase(model['gpus'])} per cell")
    if "gpus_held" in model:
        bound = [f"{len(d)} on {host} ({devices_text(d)})" for host, d in held.items() if d]
        parts.append("holding " + "; ".join(bound) if bound else "no GPU bound now")
    if isinstance(model.get("queued_cells"), int):
        parts.append(counted(model["queued_cells"], "queued cell"))
    last = model.get("last_activity")
    if isinstance(last, int | float):
        parts.append(f"last activity {seconds((now or time.time()) - last)} ago")
    return " · ".join(parts)


def cells_section(cells: Sequence[dict[str, Any]]) -> Section:
    """The last cells, newest last: where each ran, its GPUs, how long it waited and why."""
    rows = tuple(
        (
            str(cell.get("id", ""))[-8:],  # jupyter_client's ids share their session prefix
            str(cell.get("host") or "-"),
            str(cell.get("gpus", "-")),
            devices_text(cell.get("devices") or []),
            seconds(cell.get("start_delay_s")),
            "; ".join(
                filter(
                    None,
                    [
                        cell.get("waited"),
                        f"moved to {cell['moved_to']}" if cell.get("moved_to") else None,
                    ],
                )
            )
            or "-",
            str(cell.get("outcome") or "running"),
            seconds(cell.get("duration_s")),
        )
        for cell in cells
    )
    header = ("cell", "host", "GPUs", "devices", "start delay", "why", "outcome", "took")
    return Section("last cells", "", header, rows)


def hosts_view(hosts: Sequence[dict[str, Any]]) -> View:
    """``%fleet hosts``: each host's state and GPUs (committed now / subscribed / total), and
    which devices are lent to background jobs (a column shown once a gateway reports loans)."""
    header: tuple[str, ...] = ("host", "state", "GPUs committed", "subscribed", "total", "vanished")
    loans = [lent_devices(h.get("gpus") or {}) for h in hosts]
    with_loans = any(lent is not None for lent in loans)
    rows = tuple(
        (
            str(h.get("id", "")),
            str(h.get("state", "")),
            str(h.get("gpus", {}).get("committed", "-")),
            str(h.get("gpus", {}).get("subscribed", "-")),
            str(h.get("gpus", {}).get("total", "-")),
            devices_text(h.get("gpus", {}).get("vanished") or []),
            *((loans_text(lent or {}),) if with_loans else ()),
        )
        for h, lent in zip(hosts, loans, strict=True)
    )
    if with_loans:
        header += ("lent to jobs",)
    speeds = [relative_speeds(h.get("gpus") or {}) for h in hosts]
    if any(speed != 1.0 for host in speeds for speed in host):
        header += ("relative speeds",)
        rows = tuple(
            (*row, ", ".join(f"{s:g}" for s in host))
            for row, host in zip(rows, speeds, strict=True)
        )
    return View(Section(counted(len(hosts), "host"), "", header, rows))


def relative_speeds(gpus: dict[str, Any]) -> list[float]:
    """Each device's speed relative to its type (``relative_speed`` in a ``devices`` list of
    objects, `kernelfleet.gateway.gpu_speeds`), in the host's order; none from an older
    gateway. The column shows only when some GPU is not at 1.0."""
    devices = gpus.get("devices")
    if not isinstance(devices, list):
        return []
    return [
        float(d["relative_speed"])
        for d in devices
        if isinstance(d, dict) and isinstance(d.get("relative_speed"), int | float)
    ]


def lent_devices(gpus: dict[str, Any]) -> dict[str, str] | None:
    """Device -> the job it is lent to, from a host's GPU view: ``lent_to_job`` per device,
    either as a map (device -> job id or null) or in each entry of a ``devices`` list of
    objects; None when the gateway does not report loans (an older gateway)."""
    marks = gpus.get("lent_to_job")
    if isinstance(marks, dict):
        return {str(device): str(job) for device, job in marks.items() if job}
    devices = gpus.get("devices")
    if not isinstance(devices, list) or not any(
        isinstance(d, dict) and "lent_to_job" in d for d in devices
    ):
        return None
    return {
        str(d.get("id")): str(d["lent_to_job"])
        for d in devices
        if isinstance(d, dict) and d.get("lent_to_job")
    }


def loans_text(lent: dict[str, str]) -> str:
    """``0, 1 → job-1a2b3c4d; 3 → job-9f8e7d6c``: devices grouped by the job they are lent to."""
    by_job: dict[str, list[str]] = {}
    for device, job in lent.items():
        by_job.setdefault(job, []).append(device)
    return "; ".join(f"{devices_text(d)} → {job}" for job, d in by_job.items()) or "-"


def jobs_phrase(jobs: dict[str, Any]) -> str:
    """The fleet's background jobs in a line: ``1 queued, 2 running, 3 GPUs lent``."""
    return (
        f"{jobs.get('queued', 0)} queued, {jobs.get('running', 0)} running, "
        f"{gpus_phrase(int(jobs.get('gpus_lent', 0)))} lent"
    )


def policy_view(fleet: dict[str, Any]) -> View:
    """``%fleet policy``: the gateway's scheduling policy, replicas per kernel, the fleet's
    GPUs, and the autoscaler's limits and last decision."""
    gpus = fleet.get("gpus", {})
    hosts = fleet.get("hosts", {})
    rows = [
        ("policy", str(fleet.get("policy", "-"))),
        ("replicas per kernel", str(fleet.get("replicas", "-"))),
        ("hosts", f"{hosts.get('alive', 0)} alive, {hosts.get('lost', 0)} lost"),
        (
            "GPUs",
            f"{gpus.get('committed', 0)} committed, {gpus.get('subscribed', 0)} subscribed, "
            f"{gpus.get('total', 0)} in all",
        ),
        ("kernels", str(fleet.get("kernels", "-"))),
    ]
    if isinstance(fleet.get("jobs"), dict):
        rows.append(("background jobs", jobs_phrase(fleet["jobs"])))
    scaling = fleet.get("autoscaling")
    if scaling is None:
        rows.append(("autoscaling", "off"))
    else:
        rows.append(
            ("autoscaling", f"{scaling.get('min_hosts')} to {scaling.get('max_hosts')} hosts")
        )
        last = scaling.get("last_round")
        rows.append(("last decision", str(last.get("decision")) if last else "none yet"))
    note = f"kernelfleet {fleet.get('version', '?')}"
    return View(Section("the fleet's scheduling", note, (), tuple(rows)))


def events_view(events: Sequence[dict[str, Any]]) -> View:
    """``%fleet events``: the events, oldest first, each with its type-specific data."""
    rows = tuple(
        (
            str(event.get("seq", "")),
            _clock(event.get("time")),
            str(event.get("type", "")),
            str(event.get("host_id") or "-"),
            _event_details(event.get("data") or {}),
        )
        for event in events
    )
    header = ("#", "time", "event", "host", "details")
    return View(Section(f"last {counted(len(events), 'event')}", "", header, rows))


def _clock(value: Any) -> str:
    if not isinstance(value, int | float):
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(value)) + f".{int(value % 1 * 10)}"


def _event_details(data: dict[str, Any]) -> str:
    if isinstance(data.get("waited"), str):
        return data["waited"]
    return ", ".join(f"{key}={_short(value)}" for key, value in data.items())


def _short(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def tools_view(tools: Sequence[Any]) -> View:
    """``%fleet tools``: every entry point of the magics and panel-section groups."""
    rows = tuple(
        (t.group.rsplit(".", 1)[-1], t.name, t.provider, t.value, t.status or "-") for t in tools
    )
    header = ("kind", "name", "provided by", "entry point", "status")
    return View(Section(counted(len(tools), "tool entry point"), "", header, rows))
