"""The container replica runtime: a replica's kernel runs in a container of an image the
kernelspec names, through the Docker Engine API (the ``docker`` package; podman's
Docker-compatible service works too). The process runtime stays the default; a kernelspec opts
in with ``metadata.kernelfleet.runtime = "container"`` (docs/containers.md).

- `spec`: what a kernelspec asks for (image, CPU and memory limits), validated;
- `engine`: the connection to the engine, and its errors in the fleet's terms;
- `provisioner`: jupyter_client's kernel provisioner that launches, signals, watches and
  removes one replica's container, or adopts one found by its labels;
- `images`: the kernel image recipe (`kernelfleet image build`) and its kernelspec.
"""
