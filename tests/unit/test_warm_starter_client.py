"""What a launcher tells a warm task starter, and to whom: the run's whole environment
(secrets included) goes only to a process of the launcher's own user, and a warm starter
that imported other package versions than those installed now serves nobody."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from tfrun.in_task.start import warm_starter
from tfrun.launch.processes.forked_tasks import TaskStarter

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"

LISTENER = textwrap.dedent('''
    import socket, sys
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(sys.argv[1])
    listener.listen(1)
    print("listening", flush=True)
    connection, _ = listener.accept()
    connection.settimeout(10)
    received = 0
    try:
        while True:
            chunk = connection.recv(1 << 16)
            if not chunk:
                break
            received += len(chunk)
    except OSError:
        pass
    print("received", received, flush=True)
''')


@pytest.mark.skipif(os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK),
                    reason="needs root (to listen as another user) and /usr/bin/python3")
def test_a_socket_of_another_user_at_the_warm_starter_s_path_receives_nothing(tmp_path):
    """Another local user made the path first and listens there: the launcher checks the
    listener's user before it sends anything, and starts its own starter instead."""
    # A directory both users reach (pytest's own are root's only), as /tmp is.
    home = Path(tempfile.mkdtemp(prefix="tfrun-shared-", dir="/tmp"))
    os.chmod(home, 0o1777)
    path = home / "tfrun-warm.sock"
    # (the system's Python: another user may not reach this one, under root's home)
    listener = subprocess.Popen([SYSTEM_PYTHON, "-c", LISTENER, str(path)],
                                stdout=subprocess.PIPE, text=True, user=NOBODY, group=NOBODY)
    try:
        assert listener.stdout.readline().strip() == "listening"
        log = tmp_path / "starter.log"
        secret = {"PATH": os.environ["PATH"], "API_TOKEN": "do-not-send"}
        assert TaskStarter.connect(str(path), sys.executable, secret, "/", log) is None
        out, _ = listener.communicate(timeout=30)
    finally:
        listener.kill()
        shutil.rmtree(home, ignore_errors=True)
    assert out.split() == ["received", "0"], out
    note = log.read_text()
    assert f"user {NOBODY}'s" in note and "nothing was sent to it" in note, note


def test_a_warm_starter_refuses_a_run_whose_packages_differ_from_what_it_imported():
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        versions = warm_starter.installed_versions()
        assert versions["tfrun"] and versions["tensorflow"] and versions["keras"], versions
        hello = {"python": sys.executable, "env": dict(os.environ), "versions": versions}
        assert warm_starter._why_not(ours, hello, dict(os.environ), versions) == ""
        upgraded = {**versions, "tensorflow": "9.9.9"}
        why = warm_starter._why_not(ours, {**hello, "versions": upgraded}, dict(os.environ),
                                    versions)
        assert "9.9.9" in why and "restart it after an upgrade" in why, why
    finally:
        ours.close()
        theirs.close()


def test_a_variable_its_user_names_may_differ_and_pytest_s_is_not_built_in():
    mine, theirs = {"PYTEST_CURRENT_TEST": "a"}, {"PYTEST_CURRENT_TEST": "b"}
    assert warm_starter.differences(mine, theirs) == ["PYTEST_CURRENT_TEST"]
    assert warm_starter.differences(mine, theirs, frozenset({"PYTEST_CURRENT_TEST"})) == []


def test_the_default_socket_is_in_a_directory_of_this_user_only(monkeypatch, tmp_path):
    from tfrun.launch.processes.warm_starter import default_socket

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    path = default_socket({})
    directory = os.path.dirname(path)
    assert directory == str(tmp_path / f"tfrun-{os.geteuid()}")
    assert os.stat(directory).st_mode & 0o777 == 0o700
