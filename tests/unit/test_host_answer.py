"""Asking a lost host back (launch/engines/host_answer.py) with real commands: a real ssh
client against a closed port on loopback, a command that hangs, one that is missing."""

import shutil
import socket
import sys

import pytest

from tfrun.launch.engines.host_answer import ask_by_command
from tfrun.launch.engines.ssh import ssh_command


def _closed_port() -> int:
    with socket.socket() as sock:  # bound, not listening: connects are refused
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client")
def test_an_ssh_host_that_refuses_is_asked_twice_and_says_what_ssh_said():
    port = _closed_port()
    answer = ask_by_command(ssh_command("127.0.0.1", "true", ["-p", str(port)]),
                            budget=5.0, retry_after=0.1)
    assert not answer.answered
    assert f"port {port}: Connection refused" in answer.why and "(twice, 5s allowed)" in \
        answer.why, answer


def test_a_command_that_does_not_end_is_cut_at_the_budget():
    answer = ask_by_command([sys.executable, "-c", "import time; time.sleep(30)"],
                            budget=0.5)
    assert answer == type(answer)(False, "no answer within 0.5s (once, 0.5s allowed)")


def test_an_answer_and_a_missing_command():
    assert ask_by_command([sys.executable, "-c", "pass"], budget=5.0).answered
    answer = ask_by_command(["/nonexistent/ssh", "node-2", "true"], budget=5.0)
    assert not answer.answered and answer.why.startswith("could not run /nonexistent/ssh")
