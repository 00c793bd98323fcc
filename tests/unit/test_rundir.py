"""Issue 14.8 and 14.14: run directories are created atomically, locked while in use,
private (0700), and keep secret-looking arguments out of config.json."""

import json
import os
import stat
import threading

import pytest

from conftest import FAKE_TASK, REPORT_ON, Run
from tfrun.errors import ConfigError
from tfrun.launch.config import LaunchConfig
from tfrun.launch.results.rundir import RunDir, run_dir_for


def test_concurrent_launches_with_one_name_get_distinct_directories(tmp_path):
    config = LaunchConfig(entrypoint=("script", "train.py"), runs_root=str(tmp_path / "runs"),
                          name="same")
    made, errors, start = [], [], threading.Barrier(8)

    def create():
        start.wait()
        try:
            made.append(run_dir_for(config))
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len({d.path for d in made}) == 8
    for d in made:
        d.close()


def test_the_same_run_dir_twice_at_once_is_refused_then_free_again(tmp_path):
    first = RunDir.create(tmp_path / "run")
    with pytest.raises(ConfigError, match=rf"in use by another tfrun \(pid {os.getpid()}\)"):
        RunDir.create(tmp_path / "run")
    first.close()
    RunDir.create(tmp_path / "run").close()  # a restart after the first launch ended


def test_run_dirs_are_private(tmp_path):
    with RunDir.create(tmp_path / "run") as run_dir:
        for path in (run_dir.path, run_dir.path / "logs", run_dir.path / ".tfrun"):
            assert stat.S_IMODE(path.stat().st_mode) == 0o700


def test_config_json_is_private_and_redacts_secret_arguments(tmp_path):
    run = Run(tmp_path, ["--workers", "1", "--env", "HF_TOKEN=hf_abc", str(FAKE_TASK), "*=ok",
                         "--token", "s3cr3t", "--password=hunter2", "--epochs", "3"])
    assert run.run(60) == 0, run.stdout
    config = run.run_dir / "config.json"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    text = config.read_text()
    for secret in ("s3cr3t", "hunter2", "hf_abc"):
        assert secret not in text and secret not in run.stdout
    launch = json.loads(text)["launch"]
    assert launch["script_args"] == ["*=ok", "--token", "***", "--password=***", "--epochs", "3"]
    assert launch["forward_env"] == ["HF_TOKEN=***"]


def test_terraform_variables_and_secret_values_appear_nowhere(tmp_path):
    """Issue 47.2: TF_VAR_* (Terraform's inputs share TensorFlow's TF_ prefix) is never
    forwarded, and no secret value is printed: not by --dry-run for remote hosts (where
    forwarded variables are listed), not in the console, config.json, summary.json, events
    or the report of a real run."""
    env = {"TF_VAR_db_password": "hunter2", "TF_API_TOKEN": "hunter2", **REPORT_ON}
    dry = Run(tmp_path, ["--dry-run", "--hosts", "node-1,node-2", "--env", "API_TOKEN=hunter2",
                         str(FAKE_TASK), "*=ok"], env=env, name="dry")
    assert dry.run(60) == 0, dry.stdout
    assert "hunter2" not in dry.stdout and "TF_VAR_db_password" not in dry.stdout
    run = Run(tmp_path, ["--workers", "2", "--env", "API_TOKEN=hunter2", str(FAKE_TASK),
                         "*=ok"], env=env)
    assert run.run(60) == 0, run.stdout
    assert "hunter2" not in run.stdout
    files = [p for p in run.run_dir.rglob("*") if p.is_file()]
    assert {"config.json", "summary.json", "events.jsonl", "report.html"} <= {p.name for p in files}
    for path in files:
        assert b"hunter2" not in path.read_bytes(), path


def test_a_failed_run_prints_the_command_that_resumes_it(tmp_path):
    """Issue 45.1: a plain rerun gets a new run directory and starts over; a run that
    failed or was stopped prints the command that goes on with it (its run directory), and
    that command does (the banner says so)."""
    import shlex
    import subprocess
    import sys

    run = Run(tmp_path, ["--workers", "2", str(FAKE_TASK), "*=exit:3", "--token", "s3cr3t"])
    assert run.run(60) == 3, run.stdout
    line = next(l for l in run.stdout.splitlines() if "resume: tfrun --run-dir" in l)
    # it wrote no backups: the line does not promise to resume from them
    assert line.endswith("this run wrote no backups, so the script starts over; "
                         "tfrun.backup_and_restore() makes a run resumable)"), line
    command = shlex.split(line.split("resume: ", 1)[1].split("  (the same command")[0])
    assert command[:3] == ["tfrun", "--run-dir", str(run.run_dir)]
    assert command[3:] == ["--color", "never", "--workers", "2", str(FAKE_TASK), "*=exit:3",
                           "--token", "***"]  # the script's secrets are not printed
    again = subprocess.run([sys.executable, "-m", "tfrun", *command[1:-1], "s3cr3t"],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 3
    assert "(resumes the run that ended: failed)" in again.stdout, again.stdout


def _ended(path, status: str) -> None:
    (path / "summary.json").write_text(json.dumps({"status": status}))


def test_a_job_named_run_dir_is_found_again_until_its_run_succeeds(tmp_path):
    """A requeued Slurm job (same job id) runs the same command: it resumes in the run
    directory the job named, whether the first start failed, was stopped or was killed
    outright (no summary); after a success the command runs again in a new directory."""
    config = LaunchConfig(entrypoint=("script", "train.py"), runs_root=str(tmp_path / "runs"),
                          resume_key="slurm-42")
    with run_dir_for(config) as first:
        assert first.path == (tmp_path / "runs" / "slurm-42-train").resolve()
    for status in (None, "interrupted", "failed"):
        if status:
            _ended(first.path, status)
        with run_dir_for(config) as again:
            assert again.path == first.path
    _ended(first.path, "succeeded")
    with run_dir_for(config) as fresh:
        assert fresh.path != first.path and fresh.path.name.endswith("-train")
    # An explicit --run-id still wins, and a finished run there is still refused.
    named = LaunchConfig(entrypoint=("script", "train.py"), runs_root=str(tmp_path / "runs"),
                         resume_key="slurm-42", run_id="slurm-42-train")
    with pytest.raises(ConfigError, match="already holds a finished run"):
        run_dir_for(named)


def test_the_resume_line_promises_backups_only_to_a_run_that_has_some(tmp_path):
    """A script error or a hang in a run without tfrun.backup_and_restore was told the same
    command "resumes from its backups"; only a run with a backup file is."""
    from tfrun.launch.run import _has_backups, resume_line

    assert not _has_backups(tmp_path)
    (tmp_path / "backup" / "worker-0").mkdir(parents=True)
    assert not _has_backups(tmp_path)  # folders of tasks that never saved
    (tmp_path / "backup" / "worker-0" / "epoch-1.weights").write_bytes(b"x")
    assert _has_backups(tmp_path)
    line = resume_line(tmp_path, ["tfrun", "train.py"], backed_up=_has_backups(tmp_path))
    assert line.endswith("resumes from its backups)")
