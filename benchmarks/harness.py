"""What the benchmark scripts share: describing the machine, and running one from its command
line with every process stopped and the work folder removed whatever happens."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def describe_machine() -> dict[str, Any]:
    """CPUs, platform, and the versions of the parts a kernel round trip goes through."""
    import ipykernel
    import jupyter_client
    import jupyter_server
    import tornado

    import kernelfleet

    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "ipykernel": ipykernel.__version__,
        "jupyter_client": jupyter_client.__version__,
        "jupyter_server": jupyter_server.__version__,
        "tornado": tornado.version,
        "kernelfleet": kernelfleet.__version__,
    }


def add_output_arguments(parser: argparse.ArgumentParser, kept: str = "logs") -> None:
    """The options `run_benchmark` reads: ``--json OUT`` and ``--keep`` (the work folder, which
    holds `kept`)."""
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--keep", action="store_true", help=f"keep the work folder ({kept})")


def run_benchmark(
    name: str,
    args: argparse.Namespace,
    run: Callable[[Path, argparse.Namespace], dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
) -> int:
    """`run` in a fresh work folder (kept with ``--keep``), SIGTERM handled like Ctrl-C; print
    `render` of the report and write it to ``--json`` if given (`add_output_arguments`)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up on SIGTERM as on Ctrl-C
    root = Path(tempfile.mkdtemp(prefix=f"kernelfleet-{name}-"))
    try:
        report = run(root, args)
    finally:
        if args.keep:
            progress(name, f"work folder kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        progress(name, f"wrote {args.json}")
    return 0


def progress(name: str, message: str) -> None:
    print(f"[{name}] {message}", file=sys.stderr, flush=True)
