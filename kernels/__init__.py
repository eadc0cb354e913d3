"""What runs on a GPU host: the host agent, its GPU inventory and its replica launcher.

- ``kernelfleet.kernels.gpus``: the GPUs this host offers (NVML, or virtual ones).
- ``kernelfleet.kernels.replicas``: the replica table (local ipykernel processes).
- ``kernelfleet.kernels.agent``: ``HostAgentApp``, the ``kernelfleet host`` process.
- ``kernelfleet.kernels.client``: ``HostAgentClient``, how the gateway calls a host agent.
"""
