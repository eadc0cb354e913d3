"""What runs on a GPU host, split by the process it runs in.

- ``kernelfleet.kernels.agent``: the host agent process (``kernelfleet host``): its GPU inventory,
  replica launcher, HTTP API and heartbeat, and ``HostAgentClient``, how the gateway calls it.
- ``kernelfleet.kernels.replica``: the code inside each replica process: ``ReplicatedKernel``,
  GPU binding around a cell, and state sync between replicas.
- ``kernelfleet.kernels.objectstore``: the content-addressed store both the replicas and the
  gateway reach.

The host agent never imports the replica package, and the replica never imports the agent.
"""
