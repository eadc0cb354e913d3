"""The gateway's kernelspec catalog: installed kernelspecs and their GPU variants."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from traitlets import TraitError

from kernelfleet.errors import NotFound
from kernelfleet.gateway.app import GatewayApp
from kernelfleet.gateway.kernelspecs import KernelSpecCatalog, Launch


def catalog(largest: int | None = 2, counts=(1, 2, 4, 8)) -> KernelSpecCatalog:
    return KernelSpecCatalog(
        gpu_bases={"python3": "kernelfleet-python3", "not-installed": "x"},
        gpu_counts=counts,
        largest_host=None if largest is None else lambda: largest,
    )


def test_each_replicated_kernelspec_gets_a_variant_per_gpu_count_that_fits_the_largest_host():
    models = catalog(largest=2).models()
    assert models["default"] == "python3"
    assert sorted(models["kernelspecs"]) == ["python3", "python3-1gpu", "python3-2gpu"]
    base = models["kernelspecs"]["python3"]["spec"]
    one = models["kernelspecs"]["python3-1gpu"]
    two = models["kernelspecs"]["python3-2gpu"]
    assert one["spec"]["display_name"] == f"{base['display_name']} · 1 GPU"
    assert two["spec"]["display_name"] == f"{base['display_name']} · 2 GPUs"
    assert one["spec"]["language"] == base["language"] == "python"
    assert two["spec"]["metadata"]["kernelfleet"] == {"gpus": 2, "variant_of": "python3"}
    assert "kernelfleet" not in base["metadata"], "the base's own model is untouched"
    assert one["resources"]["logo-64x64"] == "/kernelspecs/python3-1gpu/logo-64x64.png"


def test_the_list_follows_the_largest_host_at_each_read():
    largest = [0]
    specs = KernelSpecCatalog(
        gpu_bases=["python3"], gpu_counts=[1, 2, 4], largest_host=lambda: largest[0]
    )
    assert list(specs.models()["kernelspecs"]) == ["python3"], "no host: no GPU kernelspec"
    largest[0] = 4
    assert list(specs.models()["kernelspecs"]) == [
        "python3", "python3-1gpu", "python3-2gpu", "python3-4gpu",
    ]  # fmt: skip
    assert list(catalog(largest=None).models()["kernelspecs"])[-1] == "python3-8gpu"
    assert list(catalog(counts=()).models()["kernelspecs"]) == ["python3"]


def test_starting_a_variant_starts_its_base_with_that_many_gpus():
    specs = catalog(largest=1)
    assert specs.launch("python3-4gpu") == Launch("python3", 4), "unlisted now, still startable"
    assert specs.launch("python3") == Launch("python3")
    assert specs.launch(None) == Launch("python3")
    assert specs.model("python3-8gpu")["spec"]["metadata"]["kernelfleet"]["gpus"] == 8
    with pytest.raises(NotFound, match="python3-3gpu"):
        specs.launch("python3-3gpu")
    logo = specs.resource_path("python3-2gpu", "logo-64x64.png")
    assert logo == specs.resource_path("python3", "logo-64x64.png")
    with pytest.raises(NotFound):
        specs.resource_path("python3-2gpu", "kernel.json")


def test_an_installed_kernelspec_of_a_variants_name_wins(tmp_path: Path, monkeypatch):
    folder = tmp_path / "kernels" / "python3-1gpu"
    folder.mkdir(parents=True)
    spec = {"argv": ["python", "-c", "pass"], "display_name": "Mine", "language": "python"}
    (folder / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    specs = catalog(largest=8)
    assert specs.launch("python3-1gpu") == Launch("python3-1gpu")
    assert specs.model("python3-1gpu")["spec"]["display_name"] == "Mine"
    assert specs.launch("python3-2gpu") == Launch("python3", 2)


@pytest.mark.parametrize(("given", "kept"), [([8, 1, 2, 2], [1, 2, 8]), ([], [])])
def test_the_gateway_option_keeps_positive_counts_in_order(given, kept):
    assert GatewayApp(gpu_kernelspecs=given).gpu_kernelspecs == kept


@pytest.mark.parametrize("bad", [[0], [2, -1]])
def test_the_gateway_option_refuses_counts_below_one(bad):
    with pytest.raises(TraitError, match="positive GPU counts"):
        GatewayApp(gpu_kernelspecs=bad)


@pytest.mark.parametrize(
    ("argv", "kept"),
    [
        (["--GatewayApp.gpu_kernelspecs=2", "--GatewayApp.gpu_kernelspecs=1"], [1, 2]),
        (["--GatewayApp.gpu_kernelspecs=[]"], []),
    ],
)
def test_the_readmes_command_line_forms_set_the_list(argv, kept):
    """As the gateway process parses them (a fresh process: one Application per process)."""
    script = (
        "import sys\nfrom kernelfleet.gateway.app import GatewayApp\n"
        "app = GatewayApp()\napp.parse_command_line(sys.argv[1:])\nprint(app.gpu_kernelspecs)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{kept}\n"
