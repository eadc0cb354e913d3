"""kernelfleet: replicated Jupyter kernels that hold GPUs only while a cell runs.

The subpackages live in the repository's top-level folders (``gateway/``, ``kernels/``,
``raft/``, ``extension/``, ``scheduler/``). A wheel moves them under this package; in a source
checkout (an editable install) this package's path is extended to the repository root so that
``kernelfleet.gateway`` finds ``./gateway`` the same way.
"""

from pathlib import Path

__version__ = "0.1.0"

_checkout_root = Path(__file__).resolve().parent.parent
if (
    not (Path(__file__).resolve().parent / "gateway").is_dir()
    and (_checkout_root / "gateway" / "__init__.py").is_file()
):
    __path__.append(str(_checkout_root))
