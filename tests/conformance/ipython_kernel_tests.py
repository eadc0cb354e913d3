"""jupyter_kernel_test's checks, for an IPython kernel: ours to fill in, the checks are its.

Not collected by the project's own run (its name is no ``test_*``): `test_suites` runs it in a
pytest of its own, once against a plain ipykernel and once through ``kernelfleet bridge``, by
giving each run a ``python3`` kernelspec of its own ($JUPYTER_PATH)."""

from __future__ import annotations

import jupyter_kernel_test


class IPythonKernelTests(jupyter_kernel_test.KernelTests):
    kernel_name = "python3"
    language_name = "python"
    file_extension = ".py"

    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; sys.stderr.write('to stderr\\n')"
    code_generate_error = "raise ValueError('on purpose')"
    code_page_something = "len?"
    code_inspect_sample = "sorted"
    code_clear_output = "from IPython.display import clear_output; clear_output()"
    code_history_pattern = "2*"
    supported_history_operations = ("tail", "range", "search")

    completion_samples = [{"text": "zi", "matches": {"zip"}}]
    complete_code_samples = ["1 + 1", "def f():\n    return 1\n", "import os"]
    incomplete_code_samples = ["for i in range(3):", "def g(x):", "(1,"]
    invalid_code_samples = ["1 +* 2", "return return"]

    code_execute_result = [
        {"code": "2 * 21", "result": "42"},
        {"code": "'k' + 'f'", "result": "'kf'"},
    ]
    code_display_data = [
        {"code": "from IPython.display import HTML, display; display(HTML('<b>x</b>'))",
         "mime": "text/html"},
        {"code": "from IPython.display import Math, display; display(Math('x^2'))",
         "mime": "text/latex"},
    ]  # fmt: skip
