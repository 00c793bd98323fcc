"""The real 2-node Slurm tests/slurm submits jobs to (tests/engines/slurm_cluster.sh); the
``slurm`` fixture in tests/conftest.py brings it up."""

import os
import re
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_SCRIPT = ROOT / "tests" / "engines" / "slurm_cluster.sh"
NODES = ("tfrun-node1", "tfrun-node2")


def unavailable() -> str | None:
    if os.geteuid() != 0:
        return "a local Slurm needs root (slurmd runs jobs as any user)"
    return None


def up() -> None:
    result = subprocess.run(["bash", str(CLUSTER_SCRIPT), "up"], capture_output=True, text=True,
                            timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"cannot start the test Slurm cluster:\n{result.stdout}\n{result.stderr}")


def down() -> None:
    subprocess.run(["bash", str(CLUSTER_SCRIPT), "down"], capture_output=True, timeout=120)


class Slurm:
    """Submit batch jobs from the repository root and read what Slurm says of them."""

    def submit(self, tmp_path: Path, body: str, *, nodes: int = 2, name: str = "job",
               chdir: Path = ROOT, env: dict | None = None) -> "Job":
        """``chdir``: the job's working directory (where a tfrun line's runs/ goes);
        ``env``: variables added to what the job inherits (sbatch exports them)."""
        script = tmp_path / f"{name}.sh"
        script.write_text(body if body.startswith("#!") else "#!/bin/bash\n" + body)
        out = tmp_path / f"{name}.out"
        result = subprocess.run(["sbatch", "--parsable", f"--nodes={nodes}", f"--output={out}",
                                 f"--chdir={chdir}", f"--job-name={name}", str(script)],
                                capture_output=True, text=True, timeout=60,
                                env={**os.environ, **(env or {})})
        assert result.returncode == 0, result.stderr
        return Job(result.stdout.strip().split(";")[0], out)


class Job:
    def __init__(self, job_id: str, out: Path) -> None:
        self.id, self.out = job_id, out

    def requeue_now(self) -> None:
        """What a preemption with PreemptMode=REQUEUE does (Slurm stops the job and queues
        it again), then start it at once: Slurm holds a requeued job for about two
        minutes (its BeginTime), which a test need not wait for."""
        command = ["scontrol", "requeue", self.id]
        result = subprocess.run(command, capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, f"{' '.join(command)}: {result.stderr}"
        self.wait_requeued()
        self.start_now()

    def wait_requeued(self, timeout: float = 120) -> None:
        """Until the job has been requeued (its restart count is 1 and it is pending) and
        its first start has left the nodes (both idle), then 2 s more: slurmd refuses a
        start whose credential is from the same second as the requeue ("Job credential
        revoked": it compares whole seconds), which Slurm's own ~2 minute hold avoids."""
        deadline = time.monotonic() + timeout
        while not (self.info().get("Restarts") == "1"
                   and self.info().get("JobState") == "PENDING"):
            assert time.monotonic() < deadline, f"job {self.id} was not requeued:\n{self.output()}"
            time.sleep(0.5)
        while set(subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True,
                                 text=True, timeout=30).stdout.split()) != {"idle"}:
            assert time.monotonic() < deadline, f"job {self.id}'s nodes never became idle"
            time.sleep(0.5)
        time.sleep(2.0)

    def start_now(self) -> None:
        """Start a requeued job at once instead of after Slurm's ~2 minute hold."""
        command = ["scontrol", "update", f"JobId={self.id}", "StartTime=now"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, f"{' '.join(command)}: {result.stderr}"

    def info(self) -> dict[str, str]:
        text = subprocess.run(["scontrol", "show", "job", "-o", self.id], capture_output=True,
                              text=True, timeout=30).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait(self, timeout: float = 300) -> tuple[str, int]:
        """(final JobState, exit code of the batch script) once the job has ended."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.info()
            if info.get("JobState") not in (None, "PENDING", "RUNNING", "CONFIGURING",
                                            "COMPLETING"):
                return info["JobState"], int(info["ExitCode"].split(":")[0])
            time.sleep(0.5)
        subprocess.run(["scancel", self.id], timeout=30)
        raise AssertionError(f"job {self.id} did not end within {timeout}s:\n{self.output()}")

    def output(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def processes(self, node: str | None = None) -> list[int]:
        """Pids on this machine (both fake nodes) whose environment is this job's (and
        ``node``'s: its steps' processes on that node)."""
        mine = f"SLURM_JOB_ID={self.id}".encode()
        on_node = f"SLURMD_NODENAME={node}".encode() if node else None
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            variables = environ.split(b"\0")
            if mine in variables and (on_node is None or on_node in variables):
                pids.append(int(entry.name))
        return pids
