"""Time state sync's namespace diff and encode over a notebook's cells, in one process.

    python benchmarks/namespace_diff.py [--notebook benchmarks/notebooks/pandas_sales.ipynb]
        [--json OUT]

Runs the notebook's code cells in order in a plain namespace (``__name__ == "__main__"``, as
IPython's), and after each one does what an executor replica does: `NamespaceTracker.diff`, then
`encode` into a `LocalDirectoryStore` (fsync on), then `commit`. Prints, per cell, the time of
each, the bytes the delta carries and the names it sends, then the sums. No kernel, no Raft: the
cost of finding and packing what a cell changed, apart from everything else
(``cell_stages.py --notebook`` measures the same stage inside a live kernel, with the rest).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kernelfleet.kernels.objectstore import LocalDirectoryStore
from kernelfleet.kernels.replica.statesync import NamespaceTracker, encode

DEFAULT_NOTEBOOK = Path(__file__).with_name("notebooks") / "pandas_sales.ipynb"


def code_cells(path: Path) -> list[str]:
    notebook = json.loads(path.read_text())
    return ["".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "code"]


def measure(path: Path, store_root: Path) -> list[dict[str, Any]]:
    """Per code cell: diff and encode times (ms), the delta's frame bytes and sent names."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    tracker = NamespaceTracker(namespace)
    store = LocalDirectoryStore(store_root)
    cells = []
    for index, source in enumerate(code_cells(path), 1):
        exec(compile(source, f"<{path.name} code cell {index}>", "exec"), namespace)
        started = time.perf_counter()
        delta = tracker.diff()
        diffed = time.perf_counter()
        encoded = encode(delta, store)
        encoded_at = time.perf_counter()
        tracker.commit(delta, encoded)
        cells.append(
            {
                "code_cell": index,
                "diff_ms": (diffed - started) * 1000,
                "encode_ms": (encoded_at - diffed) * 1000,
                "sent_bytes": sum(frame.size for frame in delta.changed.values()),
                "sent": sorted(delta.names()),
            }
        )
    return cells


def report(path: Path, cells: list[dict[str, Any]]) -> str:
    lines = [
        f"{path.name}: state sync per code cell (ms)",
        "cell     diff   encode    sent KiB  names",
    ]
    for cell in cells:
        names = ", ".join(cell["sent"])
        lines.append(
            f"{cell['code_cell']:>4} {cell['diff_ms']:>8.1f} {cell['encode_ms']:>8.1f}"
            f" {cell['sent_bytes'] / 1024:>11.1f}  {names[:60]}"
        )
    diff = sum(cell["diff_ms"] for cell in cells)
    packed = sum(cell["encode_ms"] for cell in cells)
    sent = sum(cell["sent_bytes"] for cell in cells)
    lines.append(f" sum {diff:>8.1f} {packed:>8.1f} {sent / 1024:>11.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notebook", type=Path, default=DEFAULT_NOTEBOOK)
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="namespace-diff-") as folder:
        cells = measure(args.notebook, Path(folder) / "store")
    print(report(args.notebook, cells))
    if args.json is not None:
        summary = {
            "notebook": args.notebook.name,
            "cells": cells,
            "diff_ms": sum(cell["diff_ms"] for cell in cells),
            "encode_ms": sum(cell["encode_ms"] for cell in cells),
            "sent_bytes": sum(cell["sent_bytes"] for cell in cells),
        }
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
