"""A local cluster's TensorFlow servers are unreachable from other machines (issues 14.1, 34).

Default (``loopback``): the tasks' servers bind this machine's loopback only (``ss -ltn``
shows no task port on another address) while the script reaches a service on the host's
127.0.0.1 unchanged -- with no slirp4netns or pasta installed, and with them.
``--network private``: the tasks run in a network namespace of their own (nothing listens
on their ports in the host's namespace; outbound through slirp4netns). With neither
possible, ``auto`` warns loudly and ``loopback``/``private`` refuse to start.
"""

import http.server
import os
import shutil
import subprocess
import threading
import time

import psutil
import pytest

from conftest import ROOT, Run, assert_nothing_left

SCRIPT = ROOT / "tests" / "scripts" / "network_probe.py"


def _require_private_network() -> None:
    reason = None
    if shutil.which("ss") is None or shutil.which("cc") is None:
        reason = "ss/cc are not installed (iproute2, gcc)"
    elif shutil.which("slirp4netns") is None:
        reason = "slirp4netns is not installed (apt-get install slirp4netns)"
    elif shutil.which("ss") is None or shutil.which("nsenter") is None:
        reason = "ss/nsenter are not installed (iproute2, util-linux)"
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI must test the private network, but: {reason}")
        pytest.skip(reason)


class LoopbackServer:
    """An HTTP server on the host's 127.0.0.1 (an MLflow or TensorBoard server, say); records
    which task asked (the request path) and answers "welcome"."""

    def __init__(self) -> None:
        heard = self.heard = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                heard.append(self.path.strip("/"))
                body = b"welcome\n"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, count: int, run: Run, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while len(self.heard) < count:
            assert run.proc.poll() is None, run.proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, f"only heard {self.heard}"
            time.sleep(0.1)


def _listeners(ports: list[int], netns_of: int | None = None) -> list[str]:
    """``ss -ltn`` lines for ``ports``: in this namespace, or in the one of pid ``netns_of``."""
    command = ["ss", "-ltnH"]
    if netns_of is not None:
        command = ["nsenter", f"--net=/proc/{netns_of}/ns/net", *command]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    # Columns: State Recv-Q Send-Q Local-Address:Port Peer-Address:Port
    return [line for line in out.splitlines()
            if int(line.split()[3].rsplit(":", 1)[1]) in set(ports)]


def _task_pids(run: Run) -> dict[str, int]:
    return {e["task"]: e["pid"] for e in run.events()
            if e["event"] == "state" and e["new"] == "running"}


def _live_cluster(tmp_path, flags, name, env=None):
    server = LoopbackServer()
    go = tmp_path / f"{name}-go"
    run = Run(tmp_path, ["--workers", "2", *flags, str(SCRIPT), str(server.port), str(go)],
              env=env, name=name).start()
    server.wait_for(2, run)
    return run, server, go


@pytest.mark.tf
def test_local_cluster_listens_only_inside_its_private_network(tmp_path):
    _require_private_network()
    run, server, go = _live_cluster(tmp_path, ["--network", "private"], "private")
    try:
        ports = run.ports()
        # Outbound access works: every task reached the host's loopback server.
        assert sorted(server.heard) == ["worker:0", "worker:1"]
        # Host namespace: nothing listens on the task ports, on any address.
        assert _listeners(ports) == []
        # The task's namespace: its servers do listen there (so the check above can fail).
        pid = _task_pids(run)["worker:0"]
        inside = _listeners(ports, netns_of=pid)
        assert len(inside) >= 2, inside
        assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
    finally:
        go.touch()
    assert run.wait(timeout=120) == 0, run.stdout[-3000:]
    assert "network    : private" in run.stdout
    assert "host loopback answered: welcome" in run.stdout
    assert "WARNING" not in run.stdout
    assert_nothing_left(run)


def _path_without(tmp_path, missing: tuple[str, ...]) -> str:
    """A PATH with every program of this one except ``missing``: a machine without them."""
    bin_dir = tmp_path / ("bin-without-" + "-".join(missing))
    bin_dir.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            target = bin_dir / name
            if name not in missing and not target.exists() and not target.is_symlink():
                target.symlink_to(os.path.join(directory, name))
    return str(bin_dir)


#: What a machine set up by the README alone lacks: user-mode network stacks.
NETWORK_PACKAGES = ("slirp4netns", "pasta", "passt")
COMPILERS = ("cc", "gcc")


def _path_without_slirp(tmp_path) -> str:
    """No slirp4netns (so no private network), no pasta, no C compiler."""
    return _path_without(tmp_path, NETWORK_PACKAGES + COMPILERS)


#: Neither a private network nor the loopback library: no slirp4netns, and no library.
NOTHING = {"TFRUN_LOOPBACK_BIND": "off"}


def _is_loopback(address: str) -> bool:
    return address.rsplit(":", 1)[0] in ("127.0.0.1", "[::1]", "[::ffff:127.0.0.1]")


@pytest.mark.tf
@pytest.mark.parametrize("machine", ["no-extra-packages", "with-slirp4netns"])
def test_default_network_keeps_task_ports_on_loopback_and_host_services_reachable(
        tmp_path, machine):
    """The default on a machine set up by the README alone (no slirp4netns or pasta, not even
    a C compiler: the bind library shipped with tfrun): every listening task port is on
    loopback, and the tasks reach an HTTP server on this machine's 127.0.0.1 as any process
    does. Where slirp4netns is installed too, the default is the same (a private network
    would hide 127.0.0.1 from the tasks)."""
    _require_private_network()
    env = ({"PATH": _path_without_slirp(tmp_path), "CC": ""} if machine == "no-extra-packages"
           else {})
    run, server, go = _live_cluster(tmp_path, [], machine, env=env)
    try:
        assert sorted(server.heard) == ["worker:0", "worker:1"]
        listening = _listeners(run.ports())
        # The servers are up (so this can fail) and every one is on loopback.
        assert len(listening) >= 2, listening
        assert all(_is_loopback(line.split()[3]) for line in listening), listening
        pid = _task_pids(run)["worker:0"]
        assert os.readlink(f"/proc/{pid}/ns/net") == os.readlink("/proc/self/ns/net")
    finally:
        go.touch()
    assert run.wait(timeout=120) == 0, run.stdout[-3000:]
    assert "network    : loopback (TensorFlow servers on 127.0.0.1 only" in run.stdout
    assert "host loopback answered: welcome" in run.stdout
    assert "WARNING" not in run.stdout
    assert_nothing_left(run)


@pytest.mark.tf
def test_without_slirp4netns_auto_warns_and_the_servers_are_open(tmp_path):
    """The fallback, and the control for the test above: on the host's network the same
    cluster's servers listen on a wildcard address of this namespace."""
    _require_private_network()
    run, server, go = _live_cluster(tmp_path, [], "fallback",
                                    env={"PATH": _path_without_slirp(tmp_path), **NOTHING})
    try:
        open_ = _listeners(run.ports())
        assert open_ and all(line.split()[3].startswith(("*:", "0.0.0.0:", "[::]:"))
                             for line in open_), open_
    finally:
        go.touch()
    assert run.wait(timeout=120) == 0, run.stdout[-3000:]
    assert "WARNING: TensorFlow's servers of this run listen on every interface" in run.stdout
    assert "TFRUN_LOOPBACK_BIND=off" in run.stdout and "slirp4netns is not installed" in run.stdout
    assert "--network host" in run.stdout
    assert "network    : host (TensorFlow servers reachable on every interface)" in run.stdout
    assert_nothing_left(run)


def test_network_private_refuses_to_start_without_slirp4netns(tmp_path):
    run = Run(tmp_path, ["--workers", "2", "--network", "private", str(SCRIPT), "1", "x"],
              env={"PATH": _path_without_slirp(tmp_path)}, name="refused")
    assert run.run(timeout=60) == 2
    assert "--network private: cannot make a private network here" in run.stdout
    assert "apt-get install slirp4netns" in run.stdout and "--network loopback or host" in run.stdout
    assert "Traceback" not in run.stdout
    assert not run.run_dir.exists()
    assert_nothing_left(run)


def test_network_loopback_refuses_to_start_without_the_library(tmp_path):
    """No shipped copy to use (build) and no compiler: --network loopback refuses."""
    run = Run(tmp_path, ["--workers", "2", "--network", "loopback", str(SCRIPT), "1", "x"],
              env={"PATH": _path_without_slirp(tmp_path), "CC": "",
                   "TFRUN_LOOPBACK_BIND": "build"}, name="refused")
    assert run.run(timeout=60) == 2
    assert "--network loopback: no C compiler" in run.stdout
    assert "apt-get install gcc" in run.stdout and "--network private or host" in run.stdout
    assert "Traceback" not in run.stdout
    assert not run.run_dir.exists()
    assert_nothing_left(run)


def test_without_the_library_auto_uses_a_private_network(tmp_path):
    """A quick non-TF check of the second choice: no bind library but slirp4netns -> private."""
    _require_private_network()
    run = Run(tmp_path, ["--workers", "2", "--join-timeout", "3",
                         str(ROOT / "tests" / "fake_task.py"), "*=exit:0"], name="nolib",
              env=NOTHING)
    run.run(timeout=60)
    assert "network    : private" in run.stdout, run.stdout
    assert "WARNING" not in run.stdout


def test_network_host_opts_out_without_a_warning(tmp_path):
    """A quick non-TF check of the opt-out: the resolved configuration says so, no warning,
    and no holder or slirp4netns process is started."""
    run = Run(tmp_path, ["--workers", "2", "--network", "host", "--join-timeout", "3",
                         str(ROOT / "tests" / "fake_task.py"), "*=exit:0"], name="hostnet")
    run.start()
    seen: set[str] = set()
    while run.proc.poll() is None:
        for proc in psutil.Process(run.proc.pid).children(recursive=True):
            try:
                seen.add(" ".join(proc.cmdline()))
            except psutil.Error:
                pass
        time.sleep(0.05)
    run.wait()
    assert "network    : host (TensorFlow servers reachable on every interface)" in run.stdout
    assert "WARNING" not in run.stdout
    assert not [c for c in seen if "_netns_holder" in c or "slirp4netns" in c], seen
