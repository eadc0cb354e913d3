"""kernelfleet: replicated Jupyter kernels that hold GPUs only while a cell runs.

The subpackages live in the repository's top-level folders (``gateway/``, ``kernels/``,
``raft/``, ``extension/``, ``scheduler/``, ``tools/``); ``kernelfleet/<name>`` is a symbolic link
to each, so every module has one name, ``kernelfleet.<name>.<module>``, for Python, mypy and the
wheel alike. Import them only by that name, never as top-level ``gateway`` or ``kernels``.
"""

__version__ = "0.1.0"
