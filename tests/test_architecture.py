"""What may import what: the rules docs/architecture.md states, checked on the source.

Every ``import kernelfleet.X`` (at module level or inside a function) of every module is read
with `ast`; a package may import only itself and the packages `ALLOWED` names for it. The most
specific package prefix wins, so ``kernelfleet.kernels.agent`` has rules of its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kernelfleet

PACKAGE_ROOT = Path(kernelfleet.__file__).resolve().parent
REPO_ROOT = PACKAGE_ROOT.parent

# package -> the kernelfleet packages it may import besides itself.
SHARED = ("kernelfleet.errors", "kernelfleet.protocol", "kernelfleet.states")
ALLOWED: dict[str, tuple[str, ...]] = {
    # the pure layers: no process, no I/O of their own
    "kernelfleet.errors": (),
    "kernelfleet.protocol": ("kernelfleet.errors",),  # gpus_magic raises InvalidRequest
    "kernelfleet.states": (),
    "kernelfleet.runtime_file": (),
    "kernelfleet.privileges": (),
    "kernelfleet.limits": (),
    "kernelfleet.stage_log": (),
    "kernelfleet.raft": SHARED,
    "kernelfleet.scheduler": SHARED,
    # the processes
    "kernelfleet.gateway": (
        *SHARED,
        "kernelfleet.web",
        "kernelfleet.runtime_file",
        "kernelfleet.privileges",
        "kernelfleet.limits",
        "kernelfleet.scheduler",
        "kernelfleet.raft",
        "kernelfleet.kernels.agent.client",
        "kernelfleet.kernels.objectstore",
        "kernelfleet.stage_log",
    ),
    "kernelfleet.kernels.agent": (
        *SHARED,
        "kernelfleet.web",
        "kernelfleet.runtime_file",
        "kernelfleet.privileges",
        "kernelfleet.limits",
        "kernelfleet.scheduler.hostkinds",  # the kinds a host may announce (on-demand, spot)
    ),
    "kernelfleet.kernels.replica": (
        *SHARED,
        "kernelfleet.raft",
        "kernelfleet.kernels.objectstore",
        "kernelfleet.stage_log",
    ),
    "kernelfleet.kernels.objectstore": SHARED,
    "kernelfleet.kernels.magics": (*SHARED, "kernelfleet.client", "kernelfleet.jobs"),
    "kernelfleet.extension": (*SHARED, "kernelfleet.client"),
    # what runs inside a notebook
    "kernelfleet.tools": (*SHARED, "kernelfleet.client", "kernelfleet.kernels.magics"),
    # clients and glue
    "kernelfleet.client": SHARED,
    # the notebook's job library (over the client) and the job-process SDK (checkpoints)
    "kernelfleet.jobs": (*SHARED, "kernelfleet.client", "kernelfleet.kernels.objectstore"),
    "kernelfleet.web": SHARED,
    "kernelfleet.replay": (*SHARED, "kernelfleet.scheduler"),
    "kernelfleet.cli": (),
    "kernelfleet.bridge": (),  # a client of the gateway's Jupyter API, as jupyter_server is
    "kernelfleet.__main__": ("kernelfleet.cli",),
    "kernelfleet.kernels": (),  # the package's own __init__: a docstring
    "kernelfleet.testing": ("kernelfleet",),  # the pytest plugin drives every process
}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    if parts[0] != "kernelfleet":
        parts = ("kernelfleet", *parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def linked_packages() -> list[Path]:
    """The links kernelfleet/<name> -> ../<name>: the top-level folders that are subpackages."""
    return sorted(p for p in PACKAGE_ROOT.iterdir() if p.is_symlink())


def source_files() -> list[Path]:
    """Every module, read from its real folder (rglob does not follow the links). The
    JupyterLab extension's node packages (extension/node_modules, a build input) are no modules."""
    files = list(PACKAGE_ROOT.rglob("*.py"))
    for link in linked_packages():
        files += (REPO_ROOT / link.name).rglob("*.py")
    return sorted(f for f in files if "node_modules" not in f.relative_to(REPO_ROOT).parts)


def test_each_link_names_the_top_level_folder_of_the_same_name() -> None:
    names = [link.name for link in linked_packages()]
    assert names == ["extension", "gateway", "kernels", "raft", "scheduler", "tools"]
    for link in linked_packages():
        assert link.resolve() == REPO_ROOT / link.name, link
        assert (REPO_ROOT / link.name / "__init__.py").is_file(), link


def rule_for(module: str) -> tuple[str, tuple[str, ...]]:
    if module == "kernelfleet":
        return module, ()
    owners = [p for p in ALLOWED if module == p or module.startswith(p + ".")]
    assert owners, f"{module} belongs to no package in ALLOWED: add it, and to the docs"
    owner = max(owners, key=len)
    return owner, ALLOWED[owner]


def kernelfleet_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("kernelfleet"):
                names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("kernelfleet"))
    return names


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@pytest.mark.parametrize("path", source_files(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_a_module_imports_only_what_its_package_may(path: Path) -> None:
    owner, allowed = rule_for(module_name(path))
    wrong = sorted(
        name
        for name in kernelfleet_imports(path)
        if name != "kernelfleet"  # __version__
        and not within(name, owner)
        and not any(within(name, a) or a == "kernelfleet" for a in allowed)
    )
    assert not wrong, f"{owner} may not import {wrong} (docs/architecture.md)"


def test_the_rules_catch_a_forbidden_import(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    from kernelfleet.tools import checkpoint\n")
    assert kernelfleet_imports(planted) == {"kernelfleet.tools"}
    _, allowed = rule_for("kernelfleet.gateway.app")
    assert not any(within("kernelfleet.tools", a) for a in allowed)
