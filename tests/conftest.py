import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

import engine_lease
import side_by_side
import warm_tasks

ROOT = Path(__file__).resolve().parent.parent
# Inside a Slurm allocation tfrun places clusters on its nodes; the tests (and the tfrun
# processes they start) must behave the same anywhere. tests/slurm submits its own jobs.
for _name in [n for n in os.environ if n.startswith("SLURM_")]:
    del os.environ[_name]
# The launcher's report.html costs about 0.6 s per launch (matplotlib's import and the
# plots), some 3 minutes of CI over its ~250 launches; a run never fails for its report, so
# only the tests that read the page turn it back on (REPORT_ON). TFRUN_REPORT, not imported
# from tfrun.contract: this module is loaded before any test's imports.
os.environ.setdefault("TFRUN_REPORT", "0")
REPORT_ON = {"TFRUN_REPORT": "1"}
FAKE_TASK = Path(__file__).resolve().parent / "fake_task.py"


def processes_of_run(run_dir, launcher_pid: int | None = None) -> list[psutil.Process]:
    """Live processes whose environment says they belong to ``run_dir`` (tasks, reaper) or
    to the tfrun process ``launcher_pid`` (its private network's holder and slirp4netns)."""
    run_dir = str(run_dir)
    found = []
    for proc in psutil.process_iter():
        try:
            # A run starter forked by the warm starter (and so its tasks) shows the warm
            # starter's environment: it is known by its title, its tasks as its children.
            line = " ".join(proc.cmdline()).split()
            if line[2:4] == ["tfrun.in_task.start.task_starter", "--warm"] and line[4:5] == [run_dir]:
                found += [p for p in [proc, *proc.children(recursive=True)]
                          if p.status() != psutil.STATUS_ZOMBIE]
                continue
            env = proc.environ()
            mine = run_dir in (env.get("TFRUN_RUN_DIR"), env.get("TFRUN_REAPER_FOR")) or (
                launcher_pid is not None and env.get("TFRUN_NETWORK_OF") == str(launcher_pid))
            if mine and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def listening(port: int) -> bool:
    return any(c.laddr.port == port and c.status == psutil.CONN_LISTEN
               for c in psutil.net_connections(kind="tcp"))


def port_is_free(port: int) -> bool:
    """True when nobody holds or listens on ``port``.

    SO_REUSEADDR only lets the bind ignore connections in TIME_WAIT (the kernel's, after
    a TF server closed); a socket still bound or listening on the port makes it fail.
    """
    import socket

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("0.0.0.0", port))
        return True
    except OSError:
        return False
    finally:
        sock.close()


#: Every Run started in this process, in order (``pytest_runtest_call`` reads it).
_STARTED: list["Run"] = []


class Run:
    """One `tfrun` invocation in a subprocess, with its run directory."""

    def __init__(self, tmp_path: Path, args: list[str], env: dict | None = None, name="run",
                 warm: bool = True):
        """``warm``: the run may fork its tasks from the tests' warm starter (warm_tasks)."""
        self.run_dir = tmp_path / name
        self.cmd = [sys.executable, "-m", "tfrun", "--run-dir", str(self.run_dir), "--color", "never",
                    *args]
        warm_env = warm_tasks.for_run(args, env or {}) if warm else {}
        self.env = {**os.environ, **warm_env, **(env or {})}
        self.env.pop("TF_CONFIG", None)
        self.proc: subprocess.Popen | None = None
        self.stdout = ""
        self.console: Path | None = None

    def start(self, console: Path | None = None) -> "Run":
        """Start tfrun; its output goes to a pipe, or to the file ``console`` for a run
        that nothing reads until it ends (a pipe would fill, and stall tfrun's writes).
        A test that fails with it still running kills it (``pytest_runtest_call``)."""
        _STARTED.append(self)
        self.console = console
        out = open(console, "w") if console is not None else subprocess.PIPE
        try:
            self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=out,
                                         stderr=subprocess.STDOUT, text=True, cwd=str(ROOT))
        finally:
            if console is not None:
                out.close()  # the child has its own copy
        return self

    def wait(self, timeout: float = 120) -> int:
        assert self.proc is not None
        try:
            self.stdout, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.stdout, _ = self.proc.communicate()
            raise AssertionError(f"tfrun did not finish in {timeout}s:\n{self._output()}")
        self._output()
        return self.proc.returncode

    def _output(self) -> str:
        if self.console is not None:
            self.stdout = self.console.read_text()
        return self.stdout

    def run(self, timeout: float = 120) -> int:
        return self.start().wait(timeout)

    @property
    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    def tasks(self) -> dict[str, dict]:
        return {t["task"]: t for t in self.summary["tasks"]}

    def events(self) -> list[dict]:
        """The run's events so far. A live run may be writing its last line: a line
        without its newline yet is left for the next read."""
        text = (self.run_dir / "events.jsonl").read_text()
        return [json.loads(l) for l in text[:text.rfind("\n") + 1].splitlines()]

    def ports(self) -> list[int]:
        config = json.loads((self.run_dir / "config.json").read_text())
        ports = set()
        for tf_config in config["tf_configs"].values():
            for addresses in tf_config["cluster"].values():
                ports.update(int(a.rsplit(":", 1)[1]) for a in addresses)
        return sorted(ports)

    def wait_for_file(self, path: Path, timeout: float = 30, nonempty: bool = False,
                      contains: str | None = None) -> None:
        """Until ``path`` exists (and, ``nonempty``, has content: a pid file is created
        before its writer has written the pid; ``contains``: holds that text)."""
        deadline = time.monotonic() + timeout
        while not path.exists() or (nonempty and not path.read_text().strip()) or (
                contains is not None and contains not in path.read_text(errors="replace")):
            assert self.proc is not None and self.proc.poll() is None, self.proc.communicate()[0]
            assert time.monotonic() < deadline, f"{path} never appeared"
            time.sleep(0.05)


@pytest.fixture
def fake_run(tmp_path):
    """Factory: fake_run(tfrun_flags, fake_task_spec) -> Run (not started)."""
    def make(flags: list[str], spec: str, env: dict | None = None, name: str = "run") -> Run:
        return Run(tmp_path, [*flags, str(FAKE_TASK), spec], env=env, name=name, warm=False)
    return make


class Alone:
    """A program run by itself (no tfrun), started at once: it runs beside the tfrun run a
    test compares it with, on the core that run's single-threaded phases leave idle. Its
    output goes to files, so that nothing stalls it while nobody reads.

        >>> with Alone([sys.executable, program]) as alone:  # doctest: +SKIP
        ...     assert Run(tmp_path, ["--workers", "2", program]).run(300) == 0
        ...     want = history_of(alone.stdout())
    """

    def __init__(self, argv: list[str], timeout: float = 300):
        import tempfile

        import forked_alone

        self.timeout = timeout
        self._out, self._err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        # Forked from a Python that has imported TensorFlow where that is the same as a
        # new one (forked_alone): the import was most of an alone run's CPU.
        self.process = forked_alone.start(argv, env, ROOT, self._out, self._err) or \
            subprocess.Popen(argv, stdout=self._out, stderr=self._err, text=True, cwd=ROOT,
                             env=env)

    def stdout(self) -> str:
        """Its standard output, once it has ended; it must end with code 0."""
        code = self.process.wait(self.timeout)
        self._err.seek(0)
        assert code == 0, self._err.read()[-3000:]
        self._out.seek(0)
        return self._out.read()

    def __enter__(self) -> "Alone":
        return self

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:  # the test failed first: no orphan
            self.process.kill()
            self.process.wait()
        self._out.close()
        self._err.close()


def history_of(output: str) -> dict:
    """The ``history {...}`` line a test program prints (its Keras History), as a dict."""
    line = next(l for l in output.splitlines() if "history {" in l)
    return json.loads(line.split("history ", 1)[1])


def assert_nothing_left(run: Run, timeout: float = 5.0) -> None:
    """No process of the run is alive, none of its ports is held or listening, and none
    of its tasks' cgroups remains."""
    deadline = time.monotonic() + timeout
    while True:
        alive = processes_of_run(run.run_dir, run.proc.pid if run.proc else None)
        if not alive:
            break
        if time.monotonic() > deadline:
            for p in alive:
                p.kill()
            raise AssertionError(f"processes left behind: {[(p.pid, p.cmdline()) for p in alive]}")
        time.sleep(0.1)
    if run.proc is not None:
        from tfrun.launch.processes.cgroups import own_cgroup_dir

        base = own_cgroup_dir()
        left = list(base.glob(f"tfrun-{run.proc.pid}-*")) if base is not None else []
        assert not left, f"cgroups left behind: {left}"
    if (run.run_dir / "config.json").exists():
        busy = [p for p in run.ports() if listening(p) or not port_is_free(p)]
        assert not busy, f"ports still held or listening: {busy}"


# --------------------------------------------------------------------------- shared reference runs

@pytest.fixture(scope="session")
def step_backup_reference(tmp_path_factory):
    """``reference(flavour) -> dir``: tests/scripts/step_backup.py's 3 epochs of 30 steps on
    2 local workers, never interrupted, with Keras ``flavour`` ("3" or "2"); ``dir`` holds
    its ``clean-worker-<i>.npz`` (the weights an exact resume must end with).

    Made on first use and shared by the whole session, every worker of ``-n 3`` included
    (``side_by_side.made_once``: the resume tests and the elastic fake-host tests compare
    with the same run): it only reads, so one test's failure cannot
    pass another's assertion; a reference that fails fails every test that asks for it.

        >>> want = np.load(step_backup_reference("3") / "clean-worker-0.npz")  # doctest: +SKIP
    """
    def make(tmp: Path, flavour: str) -> None:
        clean = Run(tmp, ["--workers", "2", "--keras", flavour, "--quiet-tasks",
                          str(ROOT / "tests" / "scripts" / "step_backup.py"),
                          str(tmp / "clean"), "3", "1000"], name="clean")
        assert clean.run(600) == 0, clean.stdout[-3000:]

    def reference(flavour: str = "3") -> Path:
        return side_by_side.made_once(f"step-backup-reference-keras{flavour}",
                                      tmp_path_factory, lambda tmp: make(tmp, flavour))

    return reference


#: backup_kill.py's epochs in its reference (the ten kills of test_saving_and_resume need them all)
KILL_EPOCHS = 28


@pytest.fixture(scope="session")
def backup_kill_reference(tmp_path_factory) -> Path:
    """A dir with tests/scripts/backup_kill.py's KILL_EPOCHS epochs on 2 local workers,
    never interrupted and with no slow epoch end (the sleep changes no weight), with every
    epoch's weights (``clean-worker-0-epoch<E>.npz``: what a run of E epochs ends with --
    neither the data nor the learning rate depends on the number of epochs).

    Made once for the session: the ten-kills and stopped-then-again tests and the
    preempted JobSet's test compare with it; only read, as ``step_backup_reference``.

        >>> want = np.load(backup_kill_reference / "clean-worker-0-epoch6.npz")  # doctest: +SKIP
    """
    def make(tmp: Path) -> None:
        clean = Run(tmp, ["--workers", "2", "--quiet-tasks",
                          str(ROOT / "tests" / "scripts" / "backup_kill.py"), str(tmp / "clean"),
                          str(KILL_EPOCHS), "0"], env={"EPOCH_WEIGHTS": "1"}, name="clean")
        assert clean.run(600) == 0, clean.stdout[-3000:]

    return side_by_side.made_once("backup-kill-reference", tmp_path_factory, make)


@pytest.fixture(scope="session")
def exactness_reference(tmp_path_factory):
    """``reference(flavour) -> dict``: tests/scripts/exactness.py's single-process training
    (no cluster, no strategy) on the global batches every distributed exactness test uses,
    with Keras ``flavour`` ("3" or "2"): the arrays of its ``-worker-0.npz``.

    Run once per flavour for the session (the local, fake-host, Slurm, Ray and JobSet
    exactness tests all compare with it); each call loads the arrays afresh, so no test
    sees what another did to them. Through the bootstrap, so that ``import keras`` means
    tf_keras for flavour 2, exactly as in the distributed runs.

        >>> want = exactness_reference("3")["spe1_w0"]  # doctest: +SKIP
    """
    def make(tmp: Path, flavour: str) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TF_USE_LEGACY_KERAS")}
        env["TF_CPP_MIN_LOG_LEVEL"] = "2"
        if flavour == "2":
            env.update(TFRUN_KERAS="2", TF_USE_LEGACY_KERAS="1")
        done = subprocess.run([sys.executable, "-m", "tfrun.in_task.start.bootstrap",
                               str(ROOT / "tests" / "scripts" / "exactness.py"), "reference",
                               str(tmp / "ref")], env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    def reference(flavour: str = "3") -> dict:
        made = side_by_side.made_once(f"exactness-reference-keras{flavour}", tmp_path_factory,
                                      lambda tmp: make(tmp, flavour))
        return dict(np.load(made / "ref-worker-0.npz"))

    return reference


# --------------------------------------------------------------------------- fake hosts

sys.path.insert(0, str(Path(__file__).resolve().parent / "multihost"))


@pytest.fixture(scope="session")
def fake_hosts(tmp_path_factory):
    """Three fake hosts node-1..node-3 (network namespaces + sshd), shared by the session.

    Skips with the reason where they cannot be made (not root, no sshd); CI runs as root
    and installs openssh-server, so there they always run. Held (``engine_lease``) while
    up: another worker's or session's fake hosts would share their names.
    """
    import fake_hosts as fh

    reason = fh.available()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the multi-host tests, but: {reason}")
        pytest.skip(reason)
    with engine_lease.held("fake-hosts"):
        hosts = fh.FakeHosts(3, tmp_path_factory.mktemp("fake-hosts")).up()
        side_by_side.hosts_tmp = hosts.tmp
        try:
            yield hosts
        finally:
            side_by_side.hosts_tmp = None
            hosts.down()


@pytest.fixture(autouse=True)
def _fake_hosts_cleared_after(request):
    """After each fake-host test, pass or fail: its runs stopped and their leftovers removed
    (``host_runs.stop_what_a_test_left``), so each test's outcome stays its own."""
    failed_before, started = request.session.testsfailed, time.time()
    yield
    if "fake_hosts" in request.fixturenames:
        import host_runs

        host_runs.stop_what_a_test_left()
        if request.session.testsfailed > failed_before:
            # The run directories live on the hosts' private disks, gone with the session:
            # the failure's report shows what the supervisor decided, and when.
            print(host_runs.timelines(request.getfixturevalue("fake_hosts"), since=started))


#: What importing TensorFlow sets in its process's environment (TF 2.21): a test that
#: imports it in pytest's own process leaves them, which is not the test's doing.
_SET_BY_TENSORFLOW_S_IMPORT = frozenset({
    "ENABLE_RUNTIME_UPTIME_TELEMETRY", "TF2_BEHAVIOR", "TPU_ML_PLATFORM",
    "TPU_ML_PLATFORM_VERSION", "HDF5_PLUGIN_PATH", "KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK"})


@pytest.fixture(autouse=True)
def _environment_as_found():
    """Each test leaves pytest's environment as it found it (then restored, pass or fail).
    A change that stayed went with every later run of the worker into its tasks: in a CI run,
    ``COLUMNS`` set by the CLI-reference test made 26 runs of one worker import
    TensorFlow cold (their warm starter had started without it). ``monkeypatch`` undoes its
    own changes before this check."""
    found = dict(os.environ)
    yield
    now = dict(os.environ)
    changed = sorted(name for name in found.keys() | now.keys()
                     if found.get(name) != now.get(name) and name != "PYTEST_CURRENT_TEST")
    for name in changed:  # (pytest's own PYTEST_CURRENT_TEST is not ours to restore)
        if name in found:
            os.environ[name] = found[name]
        else:
            del os.environ[name]
    left = [f"{name}: {found.get(name)!r} -> {now.get(name)!r}" for name in changed
            if name not in _SET_BY_TENSORFLOW_S_IMPORT]
    assert not left, ("the test changed pytest's environment and left it so (use "
                      "monkeypatch.setenv, or restore it): " + "; ".join(left))


# --------------------------------------------------------------------------- Slurm

sys.path.insert(0, str(Path(__file__).resolve().parent / "slurm"))


@pytest.fixture(scope="module")
def slurm():
    """A real 2-node Slurm (tfrun-node1/2) for the module that asks (tests/slurm has one),
    installed from Debian if missing: down as soon as its last test is done, not idling
    beside the rest of the session.

    Skips without root; CI runs as root, so there it always runs.
    """
    import slurm_cluster

    yield from engine_lease.engine_while_needed("Slurm", slurm_cluster, slurm_cluster.Slurm)


# --------------------------------------------------------------------------- Ray

sys.path.insert(0, str(Path(__file__).resolve().parent / "ray"))


@pytest.fixture(scope="module")
def ray_cluster():
    """A real 2-node Ray cluster (127.0.0.2 head, 127.0.0.3) for the module that asks
    (tests/ray has one); its address. Down as soon as that module's last test is done: idle,
    its GCS, raylets and workers take about 6% of a core (3.7 CPU s a minute, measured
    here), which the rest of the session's tests would otherwise share.

    Skips where Ray is not installed; CI installs tfrun's '[ray]' extra, so there it always runs.
    """
    import ray_cluster

    yield from engine_lease.engine_while_needed("Ray", ray_cluster, lambda: ray_cluster.ADDRESS)


@pytest.fixture(autouse=True)
def _nothing_left_by_an_engine(request):
    """After each Slurm or Ray test: none of the tfrun cgroups or run temporary directories
    made during it remains once the next tfrun on this machine has swept what ended
    backends left (``cgroups.sweep_ended``, ``run_tmp.sweep_ended``: Slurm ends a job step
    by SIGKILLing a node's agent together with its reaper, so nobody removes them until
    then). A cgroup still holding a process, or one or a directory whose owner lives on,
    fails the test. The directories are looked for in this worker's TMPDIR and the
    machine's /tmp (what Slurm's and Ray's daemons start may use the latter); a live one
    there counts only if its owner is this worker's (``side_by_side.started_here``), not a
    test's on another worker. The fake-host tests check the same, strictly, in
    ``host_runs.assert_nothing_left``."""
    if not {"slurm", "ray"} & {mark.name for mark in request.node.iter_markers()}:
        yield
        return
    from tfrun.launch.processes import run_tmp
    from tfrun.launch.processes.cgroups import described, own_cgroup_dir, sweep_ended

    base, started = own_cgroup_dir(), time.time()
    yield
    for tmp in side_by_side.temporary_dirs():
        run_tmp.sweep_ended(tmp)
    directories = side_by_side.made_since(started, "tfrun-tmp-*", ours=True)
    assert not directories, f"run temporary directories left behind: {directories}"
    if base is None:
        return
    sweep_ended(base)
    left = [path for path in base.glob("tfrun-*") if path.stat().st_ctime >= started]
    assert not left, "tfrun cgroups left behind: " + "; ".join(
        described(d) for path in left for d in sorted(path.rglob("*")) if d.is_dir())


#: Folders whose every test is in the quick tier (``-m quick``): pure logic, and the real
#: supervisor with fake tasks -- no TensorFlow cluster. Elsewhere a test opts in by marker.
QUICK_FOLDERS = ("unit", "supervisor")
#: Folders whose tests share an engine (the fake hosts; Slurm and Ray) and check what is
#: left on it, by xdist group: a group's tests run one at a time, on one worker. The two
#: groups do not see each other's leftovers: each worker has its own TMPDIR and cgroup,
#: and the fake hosts' processes a TMPDIR of their own (``FakeHosts.tmp``).
ENGINE_FOLDERS = {"multihost": "fake-hosts", "slurm": "engines", "ray": "engines"}
#: Modules whose module-scoped fixture starts real runs (made once per worker that runs
#: one of their tests): one group each, so it is made once.
GROUPED_MODULES = ("test_run_report.py", "test_shm_allreduce.py", "test_loopback.py")
#: Modules of ``alone`` tests (they measure how CPU is shared; test_hangs.py's fixture
#: also starts a real run), in the group of the fake hosts' (two of whose tests are
#: ``alone`` too): ``ALONE_GROUP``.
CPU_SHARE_MODULES = ("test_hangs.py", "test_contention.py")
#: The xdist group of every ``alone`` test, several at a time: they come first in it, one
#: after the other on one worker, so that the room empties once for all of them
#: (``side_by_side.turn``'s ``keep``). In CI, apart, each waited 49-79 s for the room to
#: empty; in another run, in two groups (the CPU-share modules' after the quick tier, the fake
#: hosts' two in the middle of theirs), it emptied twice and the other workers waited 543 s.
ALONE_GROUP = ENGINE_FOLDERS["multihost"]
#: The longest local tests (193-204 s and 73-94 s in CI),
#: started early so that neither is what the other workers wait for at the end.
LONGEST = (
    "test_50m_parameters_on_a_slow_disk_preempted_twice_redo_no_step_and_end_as_uninterrupted",
    "test_ten_random_kills_resume_exactly_from_the_last_complete_backup")


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection reads the markers
def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath))
        if path.parent.name in QUICK_FOLDERS:
            item.add_marker(pytest.mark.quick)
        if path.parent.name in ENGINE_FOLDERS:
            item.add_marker(pytest.mark.xdist_group(ENGINE_FOLDERS[path.parent.name]))
        elif path.name in CPU_SHARE_MODULES:
            item.add_marker(pytest.mark.xdist_group(ALONE_GROUP))
        elif path.name in GROUPED_MODULES:
            item.add_marker(pytest.mark.xdist_group(path.stem))
    # Pure tests first, then the supervisor's, then real clusters (a stable sort: each keeps
    # its order): a broken module fails in seconds, not after the slow runs it also breaks.
    # Several at a time, the engines' groups come first of all: the longest units of work,
    # they must not be what the other workers wait for at the end.
    # The longest local tests follow the quick ones, for the same reason.
    rank = {folder: i for i, folder in enumerate(QUICK_FOLDERS)}
    # A pytest-xdist worker, whose collection is the one that runs, sees no numprocesses
    # (the controller's option): it knows itself by its workerinput.
    several_at_a_time = bool(config.getoption("numprocesses", None)) \
        or hasattr(config, "workerinput")

    def order(item) -> tuple[int, int]:
        path = Path(str(item.fspath))
        if several_at_a_time and (path.parent.name in ENGINE_FOLDERS
                                  or path.name in CPU_SHARE_MODULES):
            # ALONE_GROUP's alone tests first of all, the room still empty or emptying of
            # the other workers' first, short tests (all in ALONE_GROUP: one worker).
            return (-2 if item.get_closest_marker("alone") else -1), 0
        if several_at_a_time and item.originalname in LONGEST:
            return len(rank), 0
        return rank.get(path.parent.name, len(rank) + 1), 0

    items.sort(key=order)


def pytest_configure(config):
    if hasattr(config, "workerinput"):  # a pytest-xdist worker
        side_by_side.isolate_worker(config.workerinput["workerid"])
    elif config.getoption("numprocesses", None) and not config.getoption("collectonly"):
        side_by_side.make_shared()


def pytest_unconfigure(config):
    warm_tasks.stop()
    if hasattr(config, "workerinput"):
        side_by_side.release_worker()
    else:
        side_by_side.remove_shared()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under ``-n``: a test marked ``alone`` runs with no other test on the machine."""
    asked_at = time.time()
    alone = item.get_closest_marker("alone") is not None
    keep = alone and nextitem is not None and nextitem.get_closest_marker("alone") is not None
    with side_by_side.turn(alone=alone, keep=keep), \
            side_by_side.cpu_recorded(item.nodeid, asked_at):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A test that fails leaves none of the runs it started going: a failed assertion
    skips the test's own wait, and the run would go on beside the next tests (in CI: 34 s of
    a ten-kill run). SIGKILL, which tfrun's reaper answers by killing its tasks."""
    before = len(_STARTED)
    try:
        return (yield)
    except BaseException:
        for run in _STARTED[before:]:
            if run.proc is not None and run.proc.poll() is None:
                run.proc.kill()
                try:
                    run.proc.communicate(timeout=30)
                except (subprocess.TimeoutExpired, ValueError):
                    pass
        raise
    finally:
        del _STARTED[before:]


@pytest.fixture
def small_disk(tmp_path):
    """A real 1 MiB tmpfs (root): writes past it fail with ENOSPC, as a full disk's do."""
    where = tmp_path / "disk"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (root needed): {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
