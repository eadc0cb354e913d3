"""Libraries a notebook imports: the bundled training tools.

Each tool is a subpackage that runs inside a kernel (a replica process) and reaches the platform
only through its public APIs: checkpointing (CheckFreq), energy tuning (PolyThrottle), pipeline
parallelism (PipeDream over torch pipelining), low-rank models (Pufferfish) and data loading
(CoorDL). The gateway and the host agent never import this package; tests/test_architecture.py
checks that.
"""
