"""Fake hosts on one machine: Linux network namespaces, each with its own IP, port space,
hostname and an OpenSSH server (root needed; Debian's openssh-server).

    python tests/multihost/fake_hosts.py up 2 /tmp/hosts   # node-1, node-2 (prints how to use)
    python tests/multihost/fake_hosts.py down              # remove everything it made

Layout: a "switch" namespace holds a bridge; every host namespace has a veth into it
and nothing is attached to the root namespace, so no packet ever leaves these
namespaces. Names (node-1 .. node-N) resolve through ``/etc/netns/<ns>/hosts``, which
``ip netns exec`` binds over /etc/hosts. Each host runs ``sshd`` in its own UTS
namespace (``hostname`` says node-i) on its own address; the keys are made here, in
the work directory, and the client side is one ``ssh_config`` file (``-F``).
Processes started with ``FakeHosts.popen(i, ...)`` run in host i's network, UTS and mount
namespaces, so they see what a process on that machine would.

Every host also has a disk of its own at ``PRIVATE`` (a tmpfs mounted in its sshd's mount
namespace): the same path on every host, different files on each, as on an SSH cluster
without a shared filesystem. Everything else (the repo, /tmp) is one filesystem they share.
Read a host's private files with ``FakeHosts.read(i, path)``.

What sshd starts has ``TMPDIR`` set to ``FakeHosts.tmp`` (a directory of the machine's
/tmp made by ``up``, removed by ``down``), not the machine's /tmp: what the hosts' runs
leave there is told apart from what runs started elsewhere on this machine leave in /tmp.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

PREFIX = "tfrt"
SUBNET = "10.215.0"
SSHD = "/usr/sbin/sshd"
#: A path every fake host has on a disk of its own.
PRIVATE = "/srv/tfrun-private"
#: In the command line of the tests' warm starters on the hosts (their sockets' names,
#: ``warm_hosts.py``): they serve run after run, and are no run's leftover.
WARM_MARK = f"{PRIVATE}/tests-warm-"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def available() -> str | None:
    """None when fake hosts can be made here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "fake hosts need root (network namespaces)"
    if not shutil.which("ip") or not shutil.which("nsenter") or not shutil.which("unshare"):
        return "fake hosts need iproute2 and util-linux (ip, nsenter, unshare)"
    if not Path(SSHD).exists() or not shutil.which("ssh"):
        return "fake hosts need OpenSSH (apt-get install openssh-server openssh-client)"
    return None


class FakeHosts:
    def __init__(self, count: int, workdir: Path) -> None:
        self.count = count
        self.workdir = Path(workdir)
        self.sshd: dict[int, subprocess.Popen] = {}
        #: The hosts' TMPDIR (see the module's docstring); short, as Unix sockets under it
        #: must fit in 107 bytes.
        self.tmp: Path | None = None

    # ------------------------------------------------------------------ names

    def ns(self, i: int) -> str:
        return f"{PREFIX}-h{i}"

    @staticmethod
    def name(i: int) -> str:
        return f"node-{i}"

    @staticmethod
    def address(i: int) -> str:
        return f"{SUBNET}.{i}"

    @property
    def ssh_config(self) -> Path:
        return self.workdir / "ssh_config"

    # ------------------------------------------------------------------ up / down

    def up(self) -> "FakeHosts":
        down()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix="fake-hosts-tmp-", dir="/tmp"))
        switch = f"{PREFIX}-sw"
        _ip("netns", "add", switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        hosts = "127.0.0.1 localhost\n" + "".join(
            f"{self.address(i)} {self.name(i)}\n" for i in range(1, self.count + 1))
        for i in range(1, self.count + 1):
            ns = self.ns(i)
            _ip("netns", "add", ns)
            _ip("link", "add", f"{PREFIX}v{i}", "netns", ns, "type", "veth",
                "peer", "name", f"{PREFIX}p{i}", "netns", switch)
            _ip("-n", switch, "link", "set", f"{PREFIX}p{i}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", f"{PREFIX}v{i}")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", f"{PREFIX}v{i}", "up")
            Path(f"/etc/netns/{ns}").mkdir(parents=True, exist_ok=True)
            Path(f"/etc/netns/{ns}/hosts").write_text(hosts)
        self._keys()
        for i in range(1, self.count + 1):
            self._start_sshd(i)
        return self

    def _keys(self) -> None:
        for key in ("client_key", "host_key"):
            path = self.workdir / key
            if not path.exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
                               check=True)
        shutil.copy(self.workdir / "client_key.pub", self.workdir / "authorized_keys")
        (self.workdir / "sshd_config").write_text(
            f"HostKey {self.workdir / 'host_key'}\n"
            f"AuthorizedKeysFile {self.workdir / 'authorized_keys'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile none\n"
            "MaxStartups 100\nMaxSessions 100\nLogLevel ERROR\n"
            f"SetEnv TMPDIR={self.tmp}\n")
        self.ssh_config.write_text(
            "Host node-*\n  User root\n"
            f"  IdentityFile {self.workdir / 'client_key'}\n"
            "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
            "  LogLevel ERROR\n  BatchMode yes\n")
        os.chmod(self.workdir / "client_key", 0o600)
        Path("/run/sshd").mkdir(exist_ok=True)

    def _start_sshd(self, i: int) -> None:
        Path(PRIVATE).mkdir(parents=True, exist_ok=True)
        command = ["ip", "netns", "exec", self.ns(i), "unshare", "--uts", "--mount",
                   "--propagation", "private", "sh", "-c",
                   f"mount -t tmpfs -o size=4g,mode=0755 private-disk-{i} {PRIVATE} && "
                   f"hostname {self.name(i)} && exec {SSHD} -D -e -f "
                   f"{self.workdir / 'sshd_config'} -o ListenAddress={self.address(i)}"]
        self.sshd[i] = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            probe = self.run(i, [sys.executable, "-c", "import socket; socket.create_connection("
                                 f"('{self.address(i)}', 22), 1)"])
            if probe.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd on {self.name(i)} did not come up")
            time.sleep(0.1)

    def down(self) -> None:
        import warm_hosts

        warm_hosts.forget(self)  # (the namespaces' processes are killed below)
        for process in self.sshd.values():
            process.kill()
            process.wait()
        self.sshd.clear()
        down()
        self.tmp = None

    # ------------------------------------------------------------------ using a host

    def command(self, i: int, argv: list[str], cwd: str | None = None) -> list[str]:
        """``argv`` run in host i's network, UTS (its hostname) and mount (its private disk)
        namespaces, in ``cwd`` (default: this process's working directory; entering a mount
        namespace would otherwise start it in /)."""
        pid = self.sshd[i].pid
        return ["ip", "netns", "exec", self.ns(i), "nsenter", "--uts", "--mount", "-t", str(pid),
                f"--wd={cwd or os.getcwd()}", "--", *argv]

    def popen(self, i: int, argv: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(i, argv, kwargs.get("cwd")), **kwargs)

    def run(self, i: int, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.command(i, argv, kwargs.get("cwd")), **kwargs)

    def read(self, i: int, path: str) -> str:
        """A file as host i sees it (its private disk included)."""
        done = self.run(i, ["cat", path])
        if done.returncode != 0:
            raise FileNotFoundError(f"node-{i}: {path}: {done.stderr.strip()}")
        return done.stdout

    def pids(self, i: int) -> list[int]:
        out = _ip("netns", "pids", self.ns(i), check=False).stdout.split()
        return [int(p) for p in out if p.isdigit()]

    def tfrun_processes(self, i: int | None = None) -> list[psutil.Process]:
        """Live tfrun processes (launcher, agent, reaper, task bootstraps) on host i (or any);
        not the tests' warm starters (``WARM_MARK``), whose run starters are."""
        found = []
        for host in ([i] if i else range(1, self.count + 1)):
            for pid in self.pids(host):
                try:
                    proc = psutil.Process(pid)
                    cmdline = " ".join(proc.cmdline())
                    if "tfrun" in cmdline and WARM_MARK not in cmdline \
                            and proc.status() != psutil.STATUS_ZOMBIE:
                        found.append(proc)
                except (psutil.NoSuchProcess, psutil.ZombieProcess):
                    pass
        return found

    def shape(self, i: int, rate: str | None) -> None:
        """Limit what host i sends to ``rate`` (tc's syntax, e.g. ``"2gbit"``: a cloud VM's
        link) with a token bucket on its network interface; None removes the limit. What
        it receives is limited by the sender's own bucket."""
        device = f"{PREFIX}v{i}"
        if rate is None:
            subprocess.run(["ip", "netns", "exec", self.ns(i), "tc", "qdisc", "del", "dev",
                            device, "root"], capture_output=True)
            return
        # A burst of 256 KiB holds a few of the 64 KiB segments veth sends at once (a smaller
        # one drops them); 20 ms of queue before the bucket drops.
        subprocess.run(["ip", "netns", "exec", self.ns(i), "tc", "qdisc", "replace", "dev",
                        device, "root", "tbf", "rate", rate, "burst", "256kb", "latency",
                        "20ms"], check=True, capture_output=True, text=True)

    def link(self, i: int, up: bool) -> None:
        """Plug host i's network cable in or out (a partition)."""
        _ip("-n", self.ns(i), "link", "set", f"{PREFIX}v{i}", "up" if up else "down")


def down() -> None:
    """Remove every namespace, /etc/netns entry and hosts' TMPDIR of this module (killing
    what runs there)."""
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    for line in listed:
        ns = line.split(" ")[0]
        if not ns.startswith(f"{PREFIX}-"):
            continue
        for pid in _ip("netns", "pids", ns, check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        _ip("netns", "del", ns, check=False)
        shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
    try:
        Path("/etc/netns").rmdir()
    except OSError:
        pass
    for tmp in Path("/tmp").glob("fake-hosts-tmp-*"):
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "down":
        down()
        print("fake hosts: down")
    elif len(sys.argv) >= 4 and sys.argv[1] == "up":
        reason = available()
        if reason:
            sys.exit(f"fake hosts: {reason}")
        hosts = FakeHosts(int(sys.argv[2]), Path(sys.argv[3])).up()
        for i in range(1, hosts.count + 1):
            print(f"{hosts.name(i)} = {hosts.address(i)}:  "
                  f"{' '.join(hosts.command(i, ['bash']))}")
        print(f"ssh: ssh -F {hosts.ssh_config} node-1 hostname;  down: {sys.argv[0]} down")
    else:
        sys.exit("usage: fake_hosts.py up N WORKDIR | down")
