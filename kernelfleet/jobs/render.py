"""How the job library's records show in a notebook: titled tables as HTML and as plain text.

Pure functions over strings. The HTML is plain tables that JupyterLab's own stylesheet styles,
light or dark (colours only through its ``--jp-*`` variables), as the magics' views are; the
text is aligned columns for every other frontend.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

NOTE_STYLE = "color: var(--jp-ui-font-color2, #616161); margin: 0.2em 0 0.5em 0"
TITLE_STYLE = "margin: 0.2em 0"
BAR_STYLE = (
    "display: inline-block; width: 6em; height: 0.7em; margin-right: 0.4em; "
    "vertical-align: middle; background: var(--jp-layout-color3, #bdbdbd)"
)
FILL_STYLE = "display: block; height: 100%; background: var(--jp-brand-color1, #1976d2)"


@dataclass(frozen=True)
class Block:
    """A title, a note line, and a table (no header: label/value rows), or preformatted
    ``lines`` (a log); any of them may be empty."""

    title: str
    note: str = ""
    header: tuple[str, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()
    lines: tuple[str, ...] = ()
    progress_column: int | None = None
    """The column whose cells read ``NN%``: drawn with a bar in HTML."""


def to_html(blocks: Sequence[Block]) -> str:
    parts = ['<div class="kernelfleet-view">']
    for block in blocks:
        parts.append(f'<p style="{TITLE_STYLE}"><strong>{_e(block.title)}</strong></p>')
        if block.note:
            parts.append(f'<p style="{NOTE_STYLE}">{_e(block.note)}</p>')
        if block.header or block.rows:
            parts.append(_table(block))
        if block.lines:
            parts.append(f"<pre>{_e(chr(10).join(block.lines))}</pre>")
    parts.append("</div>")
    return "\n".join(parts)


def to_text(blocks: Sequence[Block]) -> str:
    out = []
    for block in blocks:
        lines = [block.title]
        if block.note:
            lines.append(block.note)
        if block.header or block.rows:
            lines += text_table(block.header, block.rows)
        lines += [f"  {line}" for line in block.lines]
        out.append("\n".join(lines))
    return "\n\n".join(out)


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """`rows` under `header` in aligned columns; ``(none)`` under a header without rows."""
    table = [tuple(header)] if header else []
    table += [tuple(row) for row in rows]
    if not table:
        return []
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table
    ]
    return lines + ([] if rows else ["(none)"])


def progress_bar(fraction: float) -> str:
    """A bar `fraction` (0 to 1) full, in HTML."""
    width = max(0.0, min(1.0, fraction)) * 100
    return (
        f'<span style="{BAR_STYLE}"><span style="{FILL_STYLE}; width: {width:.0f}%"></span></span>'
    )


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _cell(block: Block, index: int, text: str) -> str:
    if index == block.progress_column and text.endswith("%"):
        try:
            return progress_bar(float(text[:-1]) / 100) + _e(text)
        except ValueError:
            pass
    return _e(text)


def _table(block: Block) -> str:
    head = "".join(f"<th>{_e(cell)}</th>" for cell in block.header)
    body = "".join(
        "<tr>" + "".join(f"<td>{_cell(block, i, c)}</td>" for i, c in enumerate(row)) + "</tr>"
        for row in block.rows
    )
    thead = f"<thead><tr>{head}</tr></thead>" if block.header else ""
    return f"<table>{thead}<tbody>{body}</tbody></table>"
