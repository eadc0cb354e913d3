"""The README's lines of tool magics are written as each magic parses them: every ``%tool ...``
line of the block marked ``tools`` parses with that tool's own parser (no ``UsageError``). The
tools' own tests run the commands; this keeps the README's summary of them true."""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
MARKER = "<!-- tested by tests/tools/test_readme_tools.py: tools -->"
MAGIC_LINE = re.compile(r"^(?:\w+\s*=\s*)?%%?(?P<tool>\w+)\s+(?P<arguments>.*)$")


def tool_lines() -> list[tuple[str, str]]:
    text = README.read_text()
    assert MARKER in text, "the README lost its block of tool magics"
    block = text.split(MARKER, 1)[1].split("```ipython\n", 1)[1].split("```", 1)[0]
    lines = []
    for line in block.splitlines():
        code = line.split("#", 1)[0].strip()
        if not code:  # a comment going on from the line above
            continue
        found = MAGIC_LINE.match(code)
        assert found, f"not a magic line: {line!r}"
        lines.append((found["tool"], found["arguments"]))
    return lines


@pytest.mark.parametrize(("tool", "arguments"), tool_lines())
def test_the_readme_line_parses_as_the_magic_parses_it(tool: str, arguments: str) -> None:
    magics = importlib.import_module(f"kernelfleet.tools.{tool}.magics")
    parser = getattr(magics, f"{tool}_parser")()
    assert parser.parse_args(shlex.split(arguments)) is not None


def test_every_bundled_tool_is_in_the_block() -> None:
    tools = {tool for tool, _ in tool_lines()}
    bundled = {p.name for p in (README.parent / "tools").iterdir() if (p / "magics.py").is_file()}
    assert tools == bundled
