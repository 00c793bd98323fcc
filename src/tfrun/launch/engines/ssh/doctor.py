"""Preflight: ``tfrun doctor --hosts ...`` (and automatically before an SSH launch).

One ``ssh`` per distinct host, in parallel, runs a tiny probe with the launch's Python
in the launch's working directory. The probe imports nothing heavy (versions come
from package metadata), so the whole check takes about one SSH round trip. Checked on
every host, every problem reported at once in one table:

* reachable over ssh (BatchMode: keys, no prompt), Python present, working directory;
* the same Python (major.minor), TensorFlow, Keras and tfrun versions as this machine;
* the script present; every port its tasks will use free;
* a warning (not an error) when a host's address is public: TensorFlow's gRPC servers
  are unauthenticated and listen on every interface.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata

from ....cluster import ClusterPlan, parse_address
from ....errors import ConfigError
from .command import ssh_command
from ...config import LaunchConfig
from ...output import ConsoleSink
from ...network.rendezvous import LOOPBACK_NAMES, distinct_hosts
from ...specs import task_hosts

__all__ = ["HostReport", "check_hosts", "preflight", "PACKAGES"]

PACKAGES = ("tensorflow", "keras", "tfrun")
_MARK = "TFRUN-DOCTOR "

# Runs on each host with the launch's Python: standard library only, Python 3.8+.
_PROBE = r"""
import json, os, socket, sys
req = json.loads(sys.argv[1])
from importlib import metadata
def version(name):
    try:
        return metadata.version(name)
    except Exception:
        return None
ports = {}
for port in req["ports"]:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("0.0.0.0", port))
        ports[port] = None
    except OSError as e:
        ports[port] = e.strerror or str(e)
    finally:
        s.close()
print("TFRUN-DOCTOR " + json.dumps({
    "hostname": socket.gethostname(), "python": "%d.%d.%d" % sys.version_info[:3],
    "cwd": os.getcwd(), "versions": {p: version(p) for p in req["packages"]},
    "script": None if req["script"] is None else os.path.isfile(req["script"]),
    "ports": ports}))
"""


@dataclass
class HostReport:
    host: str
    facts: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _local_facts(packages: tuple[str, ...]) -> dict:
    versions = {}
    for name in packages:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"python": "%d.%d.%d" % sys.version_info[:3], "versions": versions}


def _public_addresses(host: str) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        return []
    return sorted({i[4][0] for i in infos if ipaddress.ip_address(i[4][0].split("%")[0]).is_global})


def _probe_host(host: str, config: LaunchConfig, script: str | None, ports: list[int],
                packages: tuple[str, ...], timeout: float) -> HostReport:
    report = HostReport(host)
    request = json.dumps({"packages": list(packages), "script": script, "ports": ports})
    remote_dir = config.remote_dir or os.getcwd()
    probe = f"{shlex.quote(config.python)} -c {shlex.quote(_PROBE)} {shlex.quote(request)}"
    if host in LOOPBACK_NAMES:
        command = ["sh", "-c", f"cd {shlex.quote(remote_dir)} && exec {probe}"]
    else:
        command = ssh_command(host, f"cd {shlex.quote(remote_dir)} && exec {probe}",
                              config.ssh_opts)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        report.problems.append(f"no answer over ssh within {timeout:g}s")
        return report
    except OSError as exc:
        report.problems.append(f"cannot run ssh ({exc.strerror})")
        return report
    lines = [l for l in done.stdout.splitlines() if l.startswith(_MARK)]
    if not lines:
        said = (done.stderr.strip().splitlines() or ["(nothing)"])[-1]
        if done.returncode == 255:
            report.problems.append(f"unreachable over ssh: {said}")
        elif done.returncode == 127:
            report.problems.append(f"Python {config.python} not found there: {said}")
        else:
            report.problems.append(f"probe failed (exit {done.returncode}): {said}; "
                                   f"does {remote_dir} exist there (--remote-dir)?")
        return report
    report.facts = json.loads(lines[-1][len(_MARK):])
    return report


def check_hosts(config: LaunchConfig, plan: ClusterPlan, *, check_script: bool = True,
                timeout: float = 30.0) -> list[HostReport]:
    """Probe every host of ``plan`` and compare with this machine; one report per host."""
    hosts = task_hosts(plan)
    addresses = plan.cluster.addresses()
    nodes = distinct_hosts(hosts.values())
    ports = {n: sorted(parse_address(addresses[t])[1] for t, h in hosts.items()  # type: ignore[misc]
                       if h == n and t in addresses) for n in nodes}
    packages = PACKAGES + (("tf-keras",) if config.keras == "2" else ())
    kind, target = config.entrypoint
    script = target if check_script and kind == "script" else None
    here = _local_facts(packages)
    with ThreadPoolExecutor(max_workers=min(16, len(nodes))) as pool:
        reports = list(pool.map(lambda n: _probe_host(n, config, script, ports[n], packages,
                                                      timeout), nodes))
    for report in reports:
        facts = report.facts
        public = _public_addresses(report.host)
        if public:
            report.warnings.append(f"public address {', '.join(public)}: TensorFlow's servers "
                                   "are unauthenticated; use a private network or a firewall")
        if not facts:
            continue
        if facts["python"].rsplit(".", 1)[0] != here["python"].rsplit(".", 1)[0]:
            report.problems.append(f"Python {facts['python']} (here {here['python']})")
        for name in packages:
            theirs, ours = facts["versions"].get(name), here["versions"].get(name)
            if theirs is None:
                report.problems.append(f"{name} not installed for {config.python}")
            elif theirs != ours:
                report.problems.append(f"{name} {theirs} (here {ours})")
        if facts.get("script") is False:
            report.problems.append(f"script {script} not found in {facts['cwd']}")
        for port, error in sorted(facts["ports"].items(), key=lambda kv: int(kv[0])):
            if error:
                report.problems.append(f"port {port} taken ({error})")
    return reports


def format_table(reports: list[HostReport]) -> str:
    rows = [("host", "hostname", "python", "tensorflow", "keras", "tfrun", "status")]
    for r in reports:
        v = r.facts.get("versions", {})
        status = "; ".join(r.problems) if r.problems else "ok"
        if r.warnings:
            status += " | warning: " + "; ".join(r.warnings)
        rows.append((r.host, r.facts.get("hostname", "-"), r.facts.get("python", "-"),
                     v.get("tensorflow") or "-", v.get("keras") or "-", v.get("tfrun") or "-",
                     status))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)) + "  " + row[-1]
                     for row in rows)


def preflight(config: LaunchConfig, plan: ClusterPlan, console: ConsoleSink, *,
              check_script: bool = True) -> list[HostReport]:
    """Check every host, print the table; raise ConfigError (exit 2) on any problem."""
    reports = check_hosts(config, plan, check_script=check_script)
    console.info("preflight (tfrun doctor):\n" + format_table(reports))
    bad = [r for r in reports if r.problems]
    if bad:
        listing = "; ".join(f"{r.host}: {', '.join(r.problems)}" for r in bad)
        raise ConfigError(f"Preflight found problems on {len(bad)} host(s): {listing}",
                          expected="every host reachable over ssh with the same Python, "
                                   "TensorFlow, Keras and tfrun, the script, and free ports",
                          fix="Fix the hosts named above (or skip the check with --no-doctor)",
                          received=", ".join(r.host for r in reports))
    return reports
