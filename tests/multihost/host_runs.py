"""What the fake-host tests share: tfrun started on a fake host (``HostRun``), the ssh
flags that reach the others, and the check that nothing of a run is left on any host."""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import side_by_side
import warm_hosts
from conftest import ROOT

__all__ = ["HostRun", "assert_nothing_left", "env", "ssh_flags", "stop_what_a_test_left"]


def env() -> dict:
    out = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TF_USE_LEGACY_KERAS")}
    out["TF_CPP_MIN_LOG_LEVEL"] = "2"  # a TF_* variable: forwarded to every host's tasks
    return out


#: Every HostRun of the session, so that a test which fails midway does not leave its run
#: going into the next tests (``stop_what_a_test_left``).
_STARTED: list["HostRun"] = []


class HostRun:
    """``tfrun ARGS`` started on fake host ``i`` (in its namespaces), cwd = the repo."""

    def __init__(self, hosts, i: int, args: list[str], extra_env: dict | None = None,
                 cwd: Path = ROOT, warm: bool = True) -> None:
        """``warm``: the run's agents may fork their tasks from the hosts' warm starters
        (``warm_hosts``)."""
        self.hosts, self.i = hosts, i
        sub = args[:1] if args[:1] in (["doctor"], ["bench"]) else []  # a subcommand comes first
        cmd = [sys.executable, "-m", "tfrun", *sub, "--color", "never", *args[len(sub):]]
        launcher_env = {**env(), **(extra_env or {})}
        if warm and not sub:
            launcher_env.update(warm_hosts.env(hosts, args, launcher_env))
        self.proc = hosts.popen(i, cmd, cwd=str(cwd), env=launcher_env,
                                stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        import threading

        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        _STARTED.append(self)

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def stdout(self) -> str:
        return "".join(self.lines)

    def wait(self, timeout: float = 300) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"tfrun on node-{self.i} did not finish in {timeout}s:\n"
                                 f"{self.stdout[-4000:]}")
        self._reader.join(10)
        return code

    def wait_for(self, text: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.stdout:
            assert self.proc.poll() is None, f"tfrun ended early:\n{self.stdout[-4000:]}"
            assert time.monotonic() < deadline, f"{text!r} never appeared:\n{self.stdout[-4000:]}"
            time.sleep(0.1)


def ssh_flags(hosts) -> list[str]:
    return ["--ssh-opt", f"-F {hosts.ssh_config}"]


#: When this module was loaded: a tfrun cgroup made since is this session's.
_LOADED = time.time()


def _new_tfrun_cgroups() -> list[Path]:
    """tfrun's task cgroups (``tfrun-<pid>-...``, made by a launcher or a host's agent:
    the fake hosts share this machine's cgroup tree, and their processes are in this
    worker's cgroup, started from here) made since this module was loaded."""
    from tfrun.launch.processes.cgroups import own_cgroup_dir

    base = own_cgroup_dir()
    if base is None:
        return []
    return [path for path in base.glob("tfrun-*")
            if path.is_dir() and path.stat().st_ctime >= _LOADED]


def _new_run_tmp_dirs(hosts) -> list[Path]:
    """The run temporary directories (``tfrun-tmp-*``) made since this module was loaded,
    in the hosts' TMPDIR (one for all of them, as they share this machine's disk) and in
    this worker's (the launcher's, started here). Not the machine's /tmp: a Slurm or Ray
    test on another worker may be using it."""
    mine = [Path(tempfile.gettempdir()), hosts.tmp]
    return [path for path in side_by_side.made_since(_LOADED, "tfrun-tmp-*", mine)
            if path.is_dir()]


def assert_nothing_left(hosts, timeout: float = 10.0) -> None:
    """No tfrun process on any fake host, and none of their task cgroups or run temporary
    directories remains (a host killed with its agent's reaper included: the run's other
    agents sweep its directory when they close). Whatever is left is removed, so that the
    next test does not fail for this one's leftovers."""
    processes = _processes_left(hosts, timeout)
    assert not processes, f"tfrun processes left on the fake hosts: {processes}"
    described = _cgroups_and_directories_left(hosts)
    assert not described, f"tfrun cgroups or directories left behind: {described}"


def stop_what_a_test_left() -> None:
    """After a fake-host test, whatever its outcome: its tfrun launchers still running are
    killed, and then anything of theirs left on the hosts. Asserts nothing (a test that
    passed has said ``assert_nothing_left`` itself); it keeps one test's failure midway
    -- its run still going, holding the hosts' ports -- from failing the tests after it
    (in CI: a failed straggler test's run made the next three fail)."""
    hosts = _STARTED[0].hosts if _STARTED else None
    while _STARTED:
        run = _STARTED.pop()
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()
    if hosts is not None:
        _processes_left(hosts, timeout=15.0)  # the agents stop their tasks once cut off
        _cgroups_and_directories_left(hosts)


def timelines(hosts, since: float) -> str:
    """The events of each run directory written on the fake hosts' private disks since
    ``since`` (time.time()): what its supervisor saw and decided, one line each with
    seconds from its first event. For a failed test's report: its runs are gone with the
    session."""
    import json

    from fake_hosts import PRIVATE

    out = []
    for i in range(1, hosts.count + 1):
        found = hosts.run(i, ["find", PRIVATE, "-name", "events.jsonl",
                              "-newermt", f"@{int(since) - 1}"]).stdout.split()
        for path in found:
            try:
                events = [json.loads(line) for line in hosts.read(i, path).splitlines()]
            except (OSError, ValueError) as error:
                out.append(f"node-{i}:{path}: unreadable ({error})")
                continue
            start = events[0].get("time", 0.0) if events else 0.0
            out.append(f"--- node-{i}:{path} ({len(events)} events)")
            out += [f"{e.get('time', 0.0) - start:7.2f} " + json.dumps(
                        {k: v for k, v in e.items() if k != "time"})[:300]
                    for e in events]
    return "\n".join(out) or "no run directory on the hosts' private disks"


def _processes_left(hosts, timeout: float) -> list[tuple[int, str]]:
    """tfrun processes still on the fake hosts after ``timeout`` s, described; killed."""
    deadline = time.monotonic() + timeout
    while True:
        left = hosts.tfrun_processes()
        if not left:
            return []
        if time.monotonic() > deadline:
            described = [(p.pid, " ".join(p.cmdline())[:120]) for p in left]
            for p in left:
                p.kill()
            return described
        time.sleep(0.1)


def _cgroups_and_directories_left(hosts) -> list[str]:
    """This session's tfrun cgroups and the fake hosts' run temporary directories still
    there, described; removed."""
    cgroups = _new_tfrun_cgroups()
    described = [_describe_cgroup(c) for c in cgroups]
    directories = _new_run_tmp_dirs(hosts)
    described += [f"{d}: {sorted(p.name for p in d.iterdir())}" for d in directories]
    for cgroup in cgroups:
        _remove_cgroup_tree(cgroup)
    for directory in directories:
        shutil.rmtree(directory, ignore_errors=True)
    return described


def _describe_cgroup(path: Path) -> str:
    """``tfrun-1-ab: .../worker-1-1 (pids 12 D python3)``: what a leftover cgroup holds,
    each cgroup under it described as tfrun itself says it could not remove one."""
    from tfrun.launch.processes.cgroups import described

    return f"{path.name}: " + "; ".join(
        described(child) for child in sorted(d for d in path.rglob("*") if d.is_dir()))


def _remove_cgroup_tree(path: Path) -> None:
    from tfrun.launch.processes.cgroups import kill

    kill(path)
    for child in sorted((d for d in path.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
        _rmdir_soon(child)
    _rmdir_soon(path)


def _rmdir_soon(path: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            path.rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
