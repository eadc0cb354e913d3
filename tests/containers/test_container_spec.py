"""Unit tests of a kernelspec's container settings (no engine needed)."""

from __future__ import annotations

import pytest

from kernelfleet.kernels.agent.containers.images import kernelspec
from kernelfleet.kernels.agent.containers.spec import (
    ContainerSpec,
    ContainerSpecError,
    container_spec,
    runtime_of,
)


def settings(**fields: object) -> dict[str, object]:
    return {"kernelfleet": {"runtime": "container", **fields}}


def test_processes_are_the_default() -> None:
    assert runtime_of(None, "python3") == "process"
    assert runtime_of({"debugger": False}, "python3") == "process"
    assert container_spec({"kernelfleet": {"gpus": 1}}, "python3-1gpu") is None


def test_a_container_kernelspec_is_read() -> None:
    spec = container_spec(settings(image="localhost/k:1", cpus=2, memory="1.5g"), "k")
    assert spec == ContainerSpec("localhost/k:1", cpus=2.0, memory=int(1.5 * 2**30))
    assert spec.nano_cpus == 2 * 10**9
    assert spec.describe_memory() == "1536 MiB"
    assert container_spec(settings(image="k", memory=2**30), "k") == ContainerSpec("k", None, 2**30)
    made = kernelspec("localhost/k:1", "K", cpus=1, memory="512m")
    assert container_spec(made["metadata"], "k") == ContainerSpec("localhost/k:1", 1.0, 2**29)


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"kernelfleet": "container"}, "kernelspec 'bad': metadata.kernelfleet must be an object"),
        ({"kernelfleet": {"runtime": "vm"}}, "runtime must be one of process, container, not 'vm'"),
        (settings(), "metadata.kernelfleet.image must name an image (no spaces), not None"),
        (settings(image="a b"), "image must name an image (no spaces), not 'a b'"),
        (settings(image="k", cpus=0), "cpus must be a positive number of CPUs, not 0"),
        (settings(image="k", cpus=True), "cpus must be a positive number of CPUs, not True"),
        (settings(image="k", memory="lots"), "memory must be bytes or a size such as '512m'"),
        (settings(image="k", memory="1m"), "(at least 6m), not '1m'"),
        (settings(image="k", memory=-5), "(at least 6m), not -5"),
    ],
)
def test_bad_settings_name_the_kernelspec_field_and_value(
    metadata: dict[str, object], message: str
) -> None:
    with pytest.raises(ContainerSpecError) as raised:
        container_spec(metadata, "bad")
    assert message in raised.value.message
    assert "kernelspec 'bad'" in raised.value.message
    assert raised.value.reason == "invalid-request"
