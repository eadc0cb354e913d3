"""What a benchmark ran on, recorded beside its figures."""

from __future__ import annotations

import os
import platform
from typing import Any


def describe() -> dict[str, Any]:
    """CPUs, platform, and the versions of the parts a kernel round trip goes through."""
    import ipykernel
    import jupyter_client
    import jupyter_server
    import tornado

    import kernelfleet

    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "ipykernel": ipykernel.__version__,
        "jupyter_client": jupyter_client.__version__,
        "jupyter_server": jupyter_server.__version__,
        "tornado": tornado.version,
        "kernelfleet": kernelfleet.__version__,
    }
