"""The host agent process, one per GPU host (``kernelfleet host``).

- ``app``: ``HostAgentApp``, the process.
- ``gpus``: the GPUs this host offers (NVML, or virtual ones).
- ``replicas``: the replica table (local ipykernel processes) and their life cycle.
- ``handlers``: the agent's HTTP API; ``heartbeat``: registration with the gateway.
- ``client``: ``HostAgentClient``, how the gateway calls this API (imported by the gateway).
- ``kernelspecs/``: the replicated kernel's kernelspec, shipped with the package.
"""
