"""tfrun.launch.network.loopback: the library that keeps a local cluster's listening sockets on
loopback. Built for real and preloaded into a plain Python process, which binds the ways
TensorFlow's gRPC server and user code do; the kernel's answer (getsockname) is checked.
The whole path (a real cluster, ``ss -ltn``, a host service): tests/integration/test_private_network.py.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tfrun.launch.network import loopback
from tfrun.launch.network.loopback import LoopbackNetwork, LoopbackUnavailable, shipped_library

ROOT = Path(__file__).resolve().parents[2]

PROBE = textwrap.dedent("""
    import json, socket
    def bound(family, address, v6only=None, listen_only=False):
        s = socket.socket(family, socket.SOCK_STREAM)
        if v6only is not None:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, v6only)
        if not listen_only:
            s.bind((address, 0))
        s.listen()
        name = s.getsockname()[0]
        s.close()
        return name
    print(json.dumps({
        "ipv4 wildcard": bound(socket.AF_INET, "0.0.0.0"),
        "ipv4 empty": bound(socket.AF_INET, ""),
        "ipv4 named": bound(socket.AF_INET, "127.0.0.2"),
        "ipv6 dual-stack wildcard": bound(socket.AF_INET6, "::", v6only=0),
        "ipv6-only wildcard": bound(socket.AF_INET6, "::", v6only=1),
        "ipv4 listen unbound": bound(socket.AF_INET, None, listen_only=True),
        "ipv6 listen unbound": bound(socket.AF_INET6, None, v6only=0, listen_only=True),
    }))
""")


def _bound_addresses(env: dict) -> dict:
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=60, check=True)
    return json.loads(run.stdout)


@pytest.fixture(scope="module", params=["shipped", "build"])
def library(request, tmp_path_factory):
    """The copy shipped for this architecture, and one compiled from the source here."""
    cache = tmp_path_factory.mktemp("cache")
    if request.param == "shipped" and shipped_library() is None:
        pytest.skip(f"no copy shipped for {os.uname().machine}")
    found = LoopbackNetwork.create({**os.environ, "TFRUN_CACHE_DIR": str(cache),
                                    "TFRUN_LOOPBACK_BIND": request.param},
                                   announce=lambda line: None).library
    assert (found == shipped_library()) == (request.param == "shipped")
    return found


def test_wildcard_binds_become_loopback_and_named_ones_stay(library):
    assert _bound_addresses({"LD_PRELOAD": str(library)}) == {
        "ipv4 wildcard": "127.0.0.1",
        "ipv4 empty": "127.0.0.1",
        "ipv4 named": "127.0.0.2",                      # asked for: left alone
        "ipv6 dual-stack wildcard": "::ffff:127.0.0.1",  # IPv4 clients of 127.0.0.1 still work
        "ipv6-only wildcard": "::1",
        "ipv4 listen unbound": "127.0.0.1",
        "ipv6 listen unbound": "::ffff:127.0.0.1",
    }


def test_without_the_library_the_same_binds_are_on_every_interface():
    """The control: the probe does see wildcards when nothing is preloaded."""
    seen = _bound_addresses({})
    assert seen["ipv4 wildcard"] == "0.0.0.0" and seen["ipv6 dual-stack wildcard"] == "::"
    assert seen["ipv4 listen unbound"] == "0.0.0.0"


def test_a_dual_stack_socket_on_loopback_takes_ipv4_connections(library):
    """What gRPC does for '0.0.0.0:PORT' (a dual-stack [::] socket): clients of 127.0.0.1
    still connect; clients of this machine's other addresses would not."""
    code = textwrap.dedent("""
        import socket
        server = socket.socket(socket.AF_INET6)
        server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        server.bind(("::", 0)); server.listen()
        port = server.getsockname()[1]
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        print("connected")
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "LD_PRELOAD": str(library)}, timeout=60)
    assert run.stdout.strip() == "connected", run.stderr


def test_built_once_then_found_in_the_cache(tmp_path):
    said = []
    environ = {**os.environ, "TFRUN_CACHE_DIR": str(tmp_path / "cache"),
               "TFRUN_LOOPBACK_BIND": "build"}
    first = LoopbackNetwork.create(environ, announce=said.append)
    second = LoopbackNetwork.create(environ, announce=said.append)
    assert first.library == second.library and first.library.exists()
    assert len(said) == 2 and said[0].startswith("tfrun: building the loopback bind library")
    assert [p.name for p in (tmp_path / "cache").glob("*.partial")] == []


def test_the_users_own_preload_is_kept_after_the_library(tmp_path):
    network = LoopbackNetwork(tmp_path / "loopback_bind.so")
    assert network.task_env({"LD_PRELOAD": "/opt/libjemalloc.so"})["LD_PRELOAD"] == \
        f"{tmp_path / 'loopback_bind.so'}:/opt/libjemalloc.so"
    assert network.task_env({})["LD_PRELOAD"] == str(tmp_path / "loopback_bind.so")


def test_no_compiler_says_so_and_builds_nothing(tmp_path):
    environ = {"CC": str(tmp_path / "no-such-cc"), "TFRUN_CACHE_DIR": str(tmp_path / "cache"),
               "TFRUN_LOOPBACK_BIND": "build"}
    with pytest.raises(LoopbackUnavailable, match="no C compiler"):
        LoopbackNetwork.create(environ)
    assert not (tmp_path / "cache").exists()


def test_without_a_compiler_the_shipped_copy_is_used():
    if shipped_library() is None:
        pytest.skip(f"no copy shipped for {os.uname().machine}")
    network = LoopbackNetwork.create({"CC": "/nonexistent/cc", "PATH": "/nonexistent"})
    assert network.library == shipped_library()


def test_the_shipped_copy_is_built_from_the_current_source():
    """Editing _loopback_bind.c without running scripts/build_loopback_bind.py would make
    the shipped copy stale (then unused): this fails until it is rebuilt."""
    shipped = sorted(loopback.SOURCE.parent.glob("_loopback_bind.*.so"))
    assert shipped, "no shipped copy: run scripts/build_loopback_bind.py"
    for library in shipped:
        machine = library.name.split(".")[1]
        assert shipped_library(machine) == library, \
            f"{library.name} is stale: run python3 scripts/build_loopback_bind.py on {machine}"
    assert shipped_library("no-such-machine") is None


def _shipped_copy(tmp_path):
    """tfrun's shipped library, its .sha256 and its source, copied to ``tmp_path``."""
    machine = os.uname().machine
    if shipped_library() is None:
        pytest.skip(f"no copy shipped for {machine}")
    for name in (f"_loopback_bind.{machine}.so", f"_loopback_bind.{machine}.sha256",
                 "_loopback_bind.c"):
        shutil.copyfile(loopback.SOURCE.with_name(name), tmp_path / name)
    return tmp_path / f"_loopback_bind.{machine}.so"


def test_a_swapped_shipped_binary_is_refused_and_never_loaded(tmp_path, monkeypatch):
    """Issue 47: the .sha256 named the source only, so a replaced .so built "from the same
    source" passed. Now the binary's own hash is checked: one changed byte is refused, and
    tfrun compiles the source instead (or, with no compiler, says why it has no library)."""
    library = _shipped_copy(tmp_path)
    assert shipped_library(directory=tmp_path) == library
    data = bytearray(library.read_bytes())
    data[-1] ^= 1
    library.write_bytes(bytes(data))
    with pytest.raises(loopback.ShippedLibraryReplaced, match="is not the library tfrun shipped"):
        shipped_library(directory=tmp_path)
    monkeypatch.setattr(loopback, "SOURCE", tmp_path / "_loopback_bind.c")  # tfrun's files
    said = []
    with pytest.raises(LoopbackUnavailable, match="is not loaded. Reinstall tfrun"):
        LoopbackNetwork.create({"CC": "/nonexistent/cc", "PATH": "/nonexistent"}, said.append)
    assert said and "WARNING" in said[0]
    network = LoopbackNetwork.create({"TFRUN_CACHE_DIR": str(tmp_path / "cache"),
                                      "PATH": os.environ["PATH"]}, said.append)
    assert network.library != library and network.library.parent == tmp_path / "cache"


def test_the_shipped_binary_is_rebuilt_byte_for_byte_with_the_pinned_toolchain():
    """Issue 47: the build is reproducible: the script rebuilds the library in a temporary
    directory with the pinned toolchain and flags and compares the bytes."""
    build = ROOT / "scripts" / "build_loopback_bind.py"
    done = subprocess.run([sys.executable, str(build), "--check"], capture_output=True,
                          text=True, timeout=120)
    if done.returncode == 2 and not os.environ.get("CI"):
        pytest.skip(done.stderr.strip())  # (CI's machine has the pinned toolchain)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "identical to a rebuild" in done.stdout
    # docs/security-and-network.md's check, as a user runs it in the installed package
    checked = subprocess.run(["sha256sum", "-c", f"_loopback_bind.{os.uname().machine}.sha256"],
                             cwd=loopback.SOURCE.parent, capture_output=True, text=True)
    assert checked.returncode == 0 and checked.stdout.count(": OK") == 2, checked.stdout


def test_off_and_unknown_choices():
    with pytest.raises(LoopbackUnavailable, match="TFRUN_LOOPBACK_BIND=off"):
        LoopbackNetwork.create({"TFRUN_LOOPBACK_BIND": "off"})
    with pytest.raises(LoopbackUnavailable, match="'sometimes' is not one of shipped, build, off"):
        LoopbackNetwork.create({"TFRUN_LOOPBACK_BIND": "sometimes"})


def test_a_failed_build_leaves_nothing_half_written(tmp_path):
    broken = tmp_path / "broken-cc"
    broken.write_text("#!/bin/sh\necho 'error: boom' >&2\nexit 1\n")
    broken.chmod(0o755)
    environ = {"CC": str(broken), "TFRUN_CACHE_DIR": str(tmp_path / "cache"),
               "TFRUN_LOOPBACK_BIND": "build"}
    with pytest.raises(LoopbackUnavailable, match="broken-cc failed: error: boom"):
        LoopbackNetwork.create(environ)
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == []
