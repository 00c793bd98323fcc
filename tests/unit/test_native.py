"""tfrun.in_task.exchange._native: where the native exchange is built and cached, and that every way it can
be unavailable leaves the Python exchange with a reason (and nothing half-written). The
exchange itself: tests/unit/test_shm_allreduce.py (both paths) and the integration tests."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tfrun.in_task.exchange import _native


@pytest.fixture
def fresh(monkeypatch):
    """kernel() tries once per process: start each test untried."""
    monkeypatch.setattr(_native, "_loaded", None)
    monkeypatch.setattr(_native, "_reason", None)


@pytest.mark.parametrize("environ, expected", [
    ({"TFRUN_CACHE_DIR": "/scratch/t", "XDG_CACHE_HOME": "/x"}, "/scratch/t"),
    ({"XDG_CACHE_HOME": "/x"}, "/x/tfrun"),
    ({}, os.path.join(os.path.expanduser("~"), ".cache", "tfrun")),
])
def test_cache_dir(environ, expected):
    assert str(_native._cache_dir(environ)) == expected


@pytest.mark.parametrize("value", ["0", "off", "false", "No"])
def test_turned_off_keeps_the_python_exchange_and_says_so(fresh, value):
    assert _native.kernel({_native.KERNEL_ENV: value}) is None
    assert _native.kernel_reason() == f"TFRUN_SHM_KERNEL={value}"
    assert _native.kernel({}) is None  # decided once per process


def test_no_compiler_keeps_the_python_exchange_and_says_so(fresh, tmp_path):
    environ = {"CXX": str(tmp_path / "no-such-c++"), "TFRUN_CACHE_DIR": str(tmp_path / "c")}
    assert _native.kernel(environ) is None
    assert "no C++ compiler" in _native.kernel_reason()
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("mode", [0o777, 0o770])
def test_a_cache_others_can_write_is_not_loaded_from(fresh, tmp_path, mode):
    """A library there could have been planted by another user: Python exchange, and why."""
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(mode)
    assert _native.kernel({"TFRUN_CACHE_DIR": str(cache)}) is None
    assert "is not private to this user" in _native.kernel_reason()
    assert "TFRUN_CACHE_DIR" in _native.kernel_reason()
    assert list(cache.iterdir()) == []


def _kernel_in_subprocess(environ: dict) -> subprocess.CompletedProcess:
    """kernel() in a fresh process (it imports TensorFlow to read its build flags)."""
    code = textwrap.dedent("""
        from tfrun.in_task.exchange import _native
        loaded = _native.kernel()
        print("LOADED" if loaded else "REASON " + _native.kernel_reason())
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **environ}, timeout=600)


def _fake_compiler(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


@pytest.mark.tf
def test_a_failed_build_says_why_and_leaves_nothing_half_written(tmp_path):
    cxx = _fake_compiler(tmp_path / "broken-c++", "echo 'error: boom' >&2\nexit 1\n")
    cache = tmp_path / "cache"
    run = _kernel_in_subprocess({"CXX": cxx, "TFRUN_CACHE_DIR": str(cache)})
    assert run.returncode == 0, run.stderr[-3000:]
    assert "REASON RuntimeError: broken-c++ failed: error: boom" in run.stdout, run.stdout
    assert not list(cache.glob("*.so")) and not list(cache.glob("*.partial"))


@pytest.mark.tf
def test_built_once_then_loaded_from_the_cache(tmp_path):
    """The first process compiles; the next finds the library and does not."""
    log = tmp_path / "compiles.log"
    real = _native._compiler({})
    cxx = _fake_compiler(tmp_path / "logging-c++", f'echo x >> "{log}"\nexec "{real}" "$@"\n')
    environ = {"CXX": cxx, "TFRUN_CACHE_DIR": str(tmp_path / "cache")}
    said = []
    for _ in range(2):
        run = _kernel_in_subprocess(environ)
        assert run.returncode == 0 and "LOADED" in run.stdout, run.stdout + run.stderr[-3000:]
        said.append("building the native shared-memory exchange" in run.stdout
                    and "tfrun: built the native shared-memory exchange" in run.stdout)
    assert log.read_text().count("x") == 1
    assert said == [True, False]  # the first run says why it is slower; the next is silent
    [built] = (tmp_path / "cache").glob("shm_kernel-*.so")
    assert oct((tmp_path / "cache").stat().st_mode & 0o777) == "0o700"
