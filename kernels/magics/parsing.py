"""Argument parsing for magics: bad input raises ``UsageError`` with the usage, ``--help`` prints.

`MagicParser` is an `argparse.ArgumentParser` that never exits the process: an error raises
IPython's ``UsageError`` (shown as one line, with the usage text after it) and ``-h``/``--help``
prints the help to stdout and raises `HelpShown`, which `parse` turns into None.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from typing import NoReturn

from IPython.core.error import UsageError


class HelpShown(Exception):
    """``--help`` was asked for and printed: the magic has nothing else to do."""


class MagicParser(argparse.ArgumentParser):
    """An argument parser for a magic; its subparsers are of the same class."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}\n{self.format_usage().rstrip()}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if status == 0:
            raise HelpShown
        raise UsageError((message or "").strip() or self.format_usage().rstrip())


def parse(parser: MagicParser, line: str) -> argparse.Namespace | None:
    """`line` parsed by `parser` (shell-like quoting, ``#`` starts a comment); None when it
    asked for the help, which was printed. Raises ``UsageError`` for anything `parser` refuses."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError as e:
        raise UsageError(f"{e}\n{parser.format_usage().rstrip()}") from None
    try:
        return parser.parse_args(words)
    except HelpShown:
        return None


def count_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number from `low` to `high`."""

    def count(text: str) -> int:
        if not text.isascii() or not text.isdigit() or not low <= int(text) <= high:
            raise argparse.ArgumentTypeError(f"expected a whole number from {low} to {high}")
        return int(text)

    return count
