"""jupyter_server's gateway errors, as JupyterLab shows them (`readable`); the refusal through a
live jupyter_server is in tests/gateway/test_restart_admission.py."""

from __future__ import annotations

from tornado import web

from kernelfleet.extension.gateway_errors import readable

TEMPLATE = (
    "Error from Gateway: [%s] %s. Ensure gateway url is valid and the Gateway instance is running."
)


def test_a_refusal_reads_as_the_gateway_s_message_and_reason():
    error = web.HTTPError(400, TEMPLATE, "kernel k can never start on this fleet", "never-fits")
    mended = readable(error)
    assert mended.status_code == 400
    assert mended.log_message == "kernel k can never start on this fleet [never-fits]"
    assert mended.args == ()


def test_a_server_error_keeps_jupyter_server_s_advice_filled_in():
    error = web.HTTPError(503, TEMPLATE, "no host agent is alive", "no-hosts")
    assert readable(error).log_message == (
        "Error from Gateway: [no host agent is alive] no-hosts. Ensure gateway url is valid and "
        "the Gateway instance is running."
    )


def test_a_percent_sign_survives_and_an_error_without_arguments_is_left_alone():
    mended = readable(web.HTTPError(400, TEMPLATE, "100% of GPUs are lent", "busy"))
    assert mended.get_message() == "100% of GPUs are lent [busy]"
    plain = web.HTTPError(404, "no kernel k")
    assert readable(plain) is plain
