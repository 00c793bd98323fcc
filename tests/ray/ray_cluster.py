"""A real 2-node Ray cluster on this machine for tests/ray: the head on 127.0.0.2, a second
node on 127.0.0.3 (both given explicitly: plain ``ray start --head`` advertises the
machine's outside address).

Ray 2.60's GCS, raylets and workers listen on every interface whatever the node IP, and
so do TensorFlow's servers. So the whole cluster -- Ray, the tfrun launcher (the Ray
driver), the actors and their TensorFlow tasks -- runs in a network namespace of its own
(``NETNS``) that has only a loopback device: nothing in it is reachable from outside, and
no packet leaves it. ``command(argv)`` runs a command in there. The ``ray_cluster``
fixture in tests/conftest.py starts and stops it; ``python tests/ray/ray_cluster.py
up|down`` does the same by hand (root).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

NETNS = "tfrun-tests-ray"
HEAD, SECOND = "127.0.0.2", "127.0.0.3"
GCS_PORT = 6390
ADDRESS = f"{HEAD}:{GCS_PORT}"
CPUS_PER_NODE = 2
_COMMON = ["--disable-usage-stats", f"--num-cpus={CPUS_PER_NODE}", "--num-gpus=0"]


def unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the test Ray cluster runs in a network namespace of its own (root needed)"
    if not shutil.which("ip"):
        return "the test Ray cluster needs iproute2 (ip netns)"
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed (pip install -e '.[ray]' in tfrun's checkout)"
    if not shutil.which("ray"):
        return "the ray command is not on PATH"
    return None


def command(argv: list[str]) -> list[str]:
    """``argv`` run inside the cluster's network namespace."""
    return ["ip", "netns", "exec", NETNS, *argv]


def _ray(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run(command(["ray", *args]), capture_output=True, text=True, timeout=180,
                          env=env)


def up() -> None:
    down()  # a leftover of an interrupted session
    subprocess.run(["ip", "netns", "add", NETNS], check=True, capture_output=True)
    subprocess.run(["ip", "-n", NETNS, "link", "set", "lo", "up"], check=True, capture_output=True)
    head = _ray("start", "--head", f"--node-ip-address={HEAD}", f"--port={GCS_PORT}",
                "--include-dashboard=false", *_COMMON)
    if head.returncode != 0:
        raise RuntimeError(f"ray start --head failed:\n{head.stdout}\n{head.stderr}")
    second = _ray("start", f"--address={ADDRESS}", f"--node-ip-address={SECOND}", *_COMMON)
    if second.returncode != 0:
        down()
        raise RuntimeError(f"ray start (second node) failed:\n{second.stdout}\n{second.stderr}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if alive_nodes() == [HEAD, SECOND]:
            return
        time.sleep(0.5)
    down()
    raise RuntimeError("the two Ray nodes did not both come up within 60 s")


def lose_second_node() -> None:
    """The second node dies as a machine would: its raylet, everything under it (the
    actors' workers and their tasks) and its log monitor SIGKILLed at once."""
    import psutil

    victims = []
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or ())
        if f"node_ip_address={SECOND}" in line or f"node-ip-address={SECOND}" in line:
            victims.append(proc)
            try:
                victims += proc.children(recursive=True)
            except psutil.NoSuchProcess:
                pass
    if not victims:
        raise RuntimeError(f"no process of the Ray node {SECOND} found")
    for proc in victims:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


def start_second_node() -> None:
    """Start the second node again (after ``lose_second_node``), until Ray counts it."""
    second = _ray("start", f"--address={ADDRESS}", f"--node-ip-address={SECOND}", *_COMMON)
    if second.returncode != 0:
        raise RuntimeError(f"ray start (second node) failed:\n{second.stdout}\n{second.stderr}")
    deadline = time.monotonic() + 60
    while alive_nodes() != [HEAD, SECOND]:
        if time.monotonic() > deadline:
            raise RuntimeError("the second Ray node did not come back within 60 s")
        time.sleep(0.5)


def alive_nodes() -> list[str]:
    code = ("import ray, json; ray.init(address=%r, logging_level='ERROR'); "
            "print(json.dumps(sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive'])))"
            % ADDRESS)
    result = subprocess.run(command([sys.executable, "-c", code]), capture_output=True,
                            text=True, timeout=120)
    try:
        import json

        return json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return []


def down() -> None:
    if subprocess.run(["ip", "netns", "pids", NETNS], capture_output=True).returncode != 0:
        return  # no namespace: nothing to stop
    _ray("stop", "--force")
    subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)


if __name__ == "__main__":
    {"up": up, "down": down}[sys.argv[1]]()
