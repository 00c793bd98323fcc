"""Warm task starters on the fake hosts (``tfrun.launch.processes.warm_starter --runs multi-host``):
one per host, kind of node agent and environment at import, started at the first run that
needs it, which every later such run's agent on that host forks its tasks from.

Why: the fake-host tests are a third of the suite's CPU, and each run's agent on each host
started a task starter that imported TensorFlow and Keras (about 12 CPU s here) before its
first task. ``tests/warm_tasks.py`` does the same for local runs; a fake host needs its own,
in its namespaces, started the way its agents are:

- an SSH launch's agents run in an sshd session of the host: the warm starter is started
  over ``ssh`` too, with the variables the launcher forwards to every task
  (``tfrun.launch.specs.forwarded_env``) and the Keras choice (a node agent's tasks get
  those, on top of the session's environment);
- a ``--node-rank`` launch's agent is the ``tfrun`` that ``HostRun`` starts in the host's
  namespaces: the warm starter is started there the same way, with the same environment.

Each socket is on the host's private disk (``fake_hosts.PRIVATE``), so one path names each
host's own warm starter: the run's environment has it, and the SSH launcher forwards it to
every host. A run a warm starter may not serve (another variable, a host whose warm starter
is not up) starts its own task starter, as it would without it; ``TFRUN_TESTS_WARM=0``
turns these off with the local ones.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import warm_tasks
from conftest import ROOT
from fake_hosts import WARM_MARK

__all__ = ["assert_served", "env", "forget"]

#: (hosts' work directory, host, socket path -- which names the kind and the environment)
#: -> (the Popen started here, socket, log)
_started: dict[tuple, tuple[subprocess.Popen, str, Path]] = {}


def env(hosts, args: list[str], launcher_env: dict[str, str]) -> dict[str, str]:
    """``{VARIABLE: socket}`` for a ``tfrun ARGS`` started on a fake host with
    ``launcher_env``, the warm starters of the hosts of its ``--hosts`` up; ``{}`` when they
    are off, one did not come up, or the run has no agents (a local run: ``warm_tasks`` is
    for those)."""
    if not warm_tasks.on():
        return {}
    hosts_arg = [v for k, v in zip(args, args[1:]) if k == "--hosts"]
    if not hosts_arg:
        return {}
    node_rank = "--node-rank" in args
    keras_2 = warm_tasks.legacy_keras(args, launcher_env)
    if node_rank:
        # The agent is the tfrun started here: its tasks have its environment, and the
        # launcher's own variables (PYTHONUNBUFFERED, the Keras choice) on top.
        from tfrun.contract import CONTROLLED

        at_import = {k: v for k, v in launcher_env.items() if k not in CONTROLLED}
    else:
        from tfrun.launch.specs import forwarded_env

        at_import = forwarded_env(launcher_env, ())
    # Every host of the run at once (a --node-rank run's tfrun on each host is started
    # one after another, with the same arguments): they import side by side.
    # (only hosts that exist: a test may name one that does not, to see it refused)
    names = sorted({int(n) for n in re.findall(r"node-(\d+)", hosts_arg[0])} & set(hosts.sshd))
    if keras_2:
        at_import["TF_USE_LEGACY_KERAS"] = "1"
    # Not what may differ between runs it serves (tfrun's own, the test's name, ...): one
    # warm starter for them all.
    from tfrun.in_task.start.warm_starter import AFTER_IMPORT

    at_import = {k: v for k, v in at_import.items()
                 if not k.startswith("TFRUN_") and k not in AFTER_IMPORT | {"PYTEST_CURRENT_TEST"}}
    kind = "node" if node_rank else "ssh"
    digest = hashlib.sha1(repr(sorted(at_import.items())).encode()).hexdigest()[:10]
    path = f"{WARM_MARK}{kind}-{digest}.sock"
    for host in names:
        _start(hosts, host, kind, at_import, path)
    ready = all(_ready(hosts, host, path) for host in names)
    return {warm_tasks.VARIABLE: path} if ready else {}


def _start(hosts, i: int, kind: str, at_import: dict[str, str], path: str) -> None:
    key = (str(hosts.workdir), i, path)
    known = _started.get(key)
    if known is not None and known[0].poll() is None:
        return
    log = hosts.workdir / f"warm-node-{i}-{Path(path).stem}.log"
    starter = [sys.executable, "-m", "tfrun.launch.processes.warm_starter", "--runs", "multi-host",
               "--ignore-env", "PYTEST_CURRENT_TEST", path]
    with open(log, "wb") as out:
        if kind == "ssh":
            assignments = " ".join(shlex.quote(f"{k}={v}") for k, v in sorted(at_import.items()))
            command = (f"cd {shlex.quote(str(ROOT))} && exec env {assignments} "
                       + " ".join(shlex.quote(a) for a in starter))
            # (from the host itself: only the hosts know each other's names)
            process = hosts.popen(i, ["ssh", "-F", str(hosts.ssh_config), "-T",
                                      hosts.name(i), command],
                                  stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        else:
            process = hosts.popen(i, starter, cwd=str(ROOT), env=at_import,
                                  stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    _started[key] = (process, path, log)


def _ready(hosts, i: int, path: str, timeout: float = 120) -> bool:
    """The warm starter of ``path`` on host ``i`` listens (it has imported TensorFlow)."""
    process, _path, log = _started[(str(hosts.workdir), i, path)]
    deadline = time.monotonic() + timeout
    while "listening on" not in log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def forget(hosts) -> None:
    """The hosts are going down (which kills what runs in them): reap what was started."""
    for key in [k for k in _started if k[0] == str(hosts.workdir)]:
        process = _started.pop(key)[0]
        if process.poll() is None:
            process.kill()
        process.wait()


def assert_served(run_dir: Path, starters: int) -> None:
    """Each of the run's ``starters`` task starters (one per agent: per host) was forked
    from its host's warm starter, and imported no TensorFlow of its own (what these warm
    starters are for); nothing to check when they are off."""
    if not warm_tasks.on():
        return
    logs = {p.name: p.read_text(errors="replace")
            for p in sorted((run_dir / ".tfrun").glob("task-starter-*.log"))}
    assert len(logs) == starters, logs
    for name, text in logs.items():
        assert "forked from the warm starter" in text, (name, text)
        assert "TensorFlow imported; " not in text, (name, text)
