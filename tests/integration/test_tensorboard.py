"""Issue 13.5: tfrun --tensorboard serves the run dir's tensorboard/ on 127.0.0.1 while the run
lasts, fed by tfrun.tensorboard_dir() on the chief; nothing is left when the run ends."""

import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import psutil
import pytest

from conftest import ROOT, Run, assert_nothing_left

pytestmark = pytest.mark.tf


def test_tensorboard_serves_the_chiefs_events_during_the_run_and_stops_with_it(tmp_path):
    run = Run(tmp_path, ["--tensorboard", "--workers", "2", str(ROOT / "tests" / "scripts" / "tensorboard_fit.py")])
    proc = subprocess.Popen(run.cmd, env=run.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=str(ROOT))
    run.proc = proc
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        url = None
        while url is None and time.monotonic() < deadline:
            found = [re.search(r"tensorboard: (http://127\.0\.0\.1:(\d+)/)", l) for l in list(lines)]
            url = next((m.group(1) for m in found if m), None)
            time.sleep(0.2)
        assert url, "".join(lines)[-3000:]
        port = int(url.rsplit(":", 1)[1].strip("/"))
        # Wait until TensorBoard has read the chief's events ("train" run of keras' callback).
        runs = []
        while time.monotonic() < deadline:
            try:
                runs = json.loads(urllib.request.urlopen(url + "data/runs", timeout=5).read())
            except OSError:
                runs = []
            if "train" in runs:
                break
            time.sleep(1)
        assert "train" in runs, (runs, "".join(lines)[-3000:])
        # Only the chief's events are there: worker 1 wrote to its private scratch directory.
        assert sorted(p.name for p in (run.run_dir / "tensorboard").iterdir()) == ["train"]
        [worker1] = [l for l in lines if "worker:1 logs to" in l]
        assert str(run.run_dir / "tensorboard") not in worker1, worker1
        # No open doors: TensorBoard listens on 127.0.0.1 only.
        listening = [c for c in psutil.net_connections("inet") if c.status == psutil.CONN_LISTEN
                     and c.laddr.port == port]
        assert listening and all(c.laddr.ip == "127.0.0.1" for c in listening), listening
    finally:
        (run.run_dir / "release").touch()
        code = proc.wait(120)
        reader.join(5)
    assert code == 0, "".join(lines)[-4000:]
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert_nothing_left(run)
    assert (run.run_dir / "logs" / "tensorboard.log").exists()
    # Issue 72: the goodput ledger is there too, as scalars, with nothing in the script
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ledger = EventAccumulator(str(run.run_dir / "tensorboard" / "tfrun"))
    ledger.Reload()
    tags = ledger.Tags()["scalars"]
    assert {"goodput/share", "goodput/steps_kept_seconds", "goodput/start-up_seconds"} <= set(tags)
    [share] = ledger.Scalars("goodput/share")
    assert share.step == 1 and share.value == pytest.approx(run.summary["goodput"]["goodput"],
                                                            abs=0.01)


def test_without_tensorboard_installed_the_flag_is_a_clear_error(tmp_path):
    code = (
        "import importlib.util, sys\n"
        "real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, *a: None if name == 'tensorboard' else real(name, *a)\n"
        "from tfrun.cli import main\n"
        f"sys.exit(main(['--run-dir', {str(tmp_path / 'run')!r}, '--tensorboard', '--workers', '2', "
        f"{str(ROOT / 'tests' / 'scripts' / 'tensorboard_fit.py')!r}]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "--tensorboard needs TensorBoard" in out.stderr and "pip install tensorboard" in out.stderr
    assert not (tmp_path / "run").exists()  # refused before anything was made
