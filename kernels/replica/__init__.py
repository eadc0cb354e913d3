"""The code that runs inside a replica process (``python -m kernelfleet.kernels.replica.kernel``).

- ``kernel``: ``ReplicatedKernel``, an ipykernel whose namespace follows its kernel's Raft log.
- ``gpu_binding``: the GPUs a cell may see, and device memory freed when they are reclaimed.
- ``statesync``, ``statesync_delta``, ``statesync_pickling``: what changed in the namespace after
  a cell, how it is encoded, and how followers apply it.
"""
