"""A pooled replica binding the start that took it: env and working directory (unit tests;
the live path is tests/gateway/test_kernel_pool.py)."""

import os

import pytest

from kernelfleet.kernels.replica.start_binding import BindRefused, bind_start, check_env


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"PYTHONPATH": "/x"}, "'PYTHONPATH'"),
        ({"KERNEL_X": 3}, "'KERNEL_X'"),
        ({"KERNEL_X": "a\0b"}, "'KERNEL_X'"),
        (["KERNEL_X"], "list"),
    ],
)
def test_a_bind_refuses_env_it_cannot_apply_naming_it(env, named):
    with pytest.raises(BindRefused, match=named):
        check_env(env)


def test_a_bind_sets_the_start_env_and_moves_into_a_writable_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    wanted = tmp_path / "notebooks"
    wanted.mkdir()
    environ: dict[str, str] = {}
    cwd = bind_start({"KERNEL_USERNAME": "alice"}, str(wanted), tmp_path, environ)
    assert cwd == wanted
    assert os.getcwd() == str(wanted)
    assert environ == {"KERNEL_USERNAME": "alice"}


def test_a_bind_stays_put_for_no_folder_or_one_that_is_not_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert bind_start({}, "", tmp_path, {}) == tmp_path
    assert bind_start({}, str(tmp_path / "absent"), tmp_path, {}) == tmp_path


def test_a_malformed_bind_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    environ: dict[str, str] = {}
    with pytest.raises(BindRefused, match="working_dir"):
        bind_start({"KERNEL_A": "1"}, 7, tmp_path, environ)
    assert environ == {}
    assert os.getcwd() == str(tmp_path)
