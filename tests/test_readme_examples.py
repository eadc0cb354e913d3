"""The README's nbclient and papermill examples, run as written against ``kernelfleet up``.

Each example is the ```python block that follows its marker line in README.md
(``<!-- tested by tests/test_readme_examples.py: NAME -->``). It runs as a user runs it: a plain
Python process, in a folder holding ``train.ipynb``, with only the gateway's URL and token put
in. Once on a notebook that works and once on one whose cell fails, it must leave no kernel on
the gateway and no replica process on the hosts (a kernel nobody stops holds three processes)
but those of the warm pool's group, which ``kernelfleet up``'s gateway keeps ready.
"""

import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import nbformat
import pytest

from kernelfleet.testing import descendants, wait_for

pytestmark = pytest.mark.timeout(300)

README = Path(__file__).resolve().parents[1] / "README.md"
MARKER = "<!-- tested by tests/test_readme_examples.py: {} -->"
FENCE = "\n```python\n"


def readme_example(name: str) -> str:
    """The code of the ```python block right after the README's marker for `name`."""
    text = README.read_text()
    marker = MARKER.format(name)
    assert text.count(marker) == 1, f"README.md has no single marker {marker}"
    after = text.index(marker) + len(marker)
    assert text.startswith(FENCE, after), f"no ```python block right after {marker}"
    start = after + len(FENCE)
    return text[start : text.index("\n```\n", start) + 1]


def replica_processes(up) -> list[int]:
    """The replica processes running under ``kernelfleet up`` (its hosts' kernels)."""
    found = []
    for pid in descendants(up.process.pid):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"kernelfleet.kernels.replica" in command:
            found.append(pid)
    return found


def kernels_of(pids: list[int]) -> set[str]:
    """The kernel ids the replica processes `pids` belong to, from their environment."""
    found = set()
    for pid in pids:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        found.update(
            item.split(b"=", 1)[1].decode()
            for item in environ
            if item.startswith(b"KERNELFLEET_KERNEL_ID=")
        )
    return found


def pooled_groups(up) -> int:
    """The warm pool's ready groups, from the gateway's /metrics."""
    request = urllib.request.Request(
        up.url + "/metrics", headers={"Authorization": f"token {up.token}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    found = re.search(r"^kernelfleet_kernel_pool_ready (\S+)$", text, re.M)
    assert found, text
    return int(float(found.group(1)))


def nothing_left(up) -> bool:
    """No kernel, and no replica process but the pool's groups (each a kernel id of its own)."""
    pooled = pooled_groups(up)
    return up.api("GET", "/api/kernels") == [] and len(kernels_of(replica_processes(up))) == pooled


def write_notebook(folder: Path, failing: bool) -> None:
    """``train.ipynb``: a ``parameters`` cell (``epochs = 1``), then one that prints it, or
    raises for a `failing` notebook."""
    parameters = nbformat.v4.new_code_cell("epochs = 1")
    parameters.metadata["tags"] = ["parameters"]
    body = "raise ValueError('bad data')" if failing else "print('epochs', epochs)"
    notebook = nbformat.v4.new_notebook(
        cells=[parameters, nbformat.v4.new_code_cell(body)],
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
    )
    nbformat.write(notebook, folder / "train.ipynb")


def run_example(script: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """The script in a fresh Python process; an unawaited coroutine is an error there."""
    return subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-c", script],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=180,
    )


def outputs(folder: Path) -> list[dict]:
    """The outputs of the last cell of ``train.out.ipynb``, the notebook the example saved."""
    return nbformat.read(folder / "train.out.ipynb", as_version=4).cells[-1].outputs


@pytest.mark.parametrize(
    ("name", "printed", "failure"),
    [
        ("nbclient", "epochs 1\n", "CellExecutionError"),
        ("papermill", "epochs 3\n", "PapermillExecutionError"),
    ],
)
def test_a_readme_example_runs_as_written_and_leaves_no_kernel(
    kernelfleet_up, tmp_path, name, printed, failure
):
    up = kernelfleet_up()
    example = readme_example(name)
    assert "http://127.0.0.1:8765" in example
    assert '"TOKEN"' in example
    script = example.replace("http://127.0.0.1:8765", up.url).replace('"TOKEN"', repr(up.token))

    # The check sees a kernel's replicas while it runs, and their end once it is stopped.
    kernel_id = up.api("POST", "/api/kernels", {"name": "python3"}, expect=201)["id"]
    assert len(replica_processes(up)) >= 3, "one process per replica"
    up.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
    wait_for(lambda: nothing_left(up), 30, "the kernel's replica processes to end")

    write_notebook(tmp_path, failing=False)
    done = run_example(script, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert outputs(tmp_path)[0]["text"] == printed
    wait_for(lambda: nothing_left(up), 30, "no kernel and no replica left after a notebook ran")

    write_notebook(tmp_path, failing=True)
    done = run_example(script, tmp_path)
    assert done.returncode != 0
    assert failure in done.stderr, done.stderr[-3000:]
    assert "bad data" in done.stderr
    assert outputs(tmp_path)[-1]["ename"] == "ValueError", "the failure is saved in the notebook"
    wait_for(lambda: nothing_left(up), 30, "no kernel and no replica left after a cell failed")
