"""Two holders of one test engine cannot kill each other's, whatever pytest and xdist do.

The fake hosts', Slurm's and Ray's fixtures bring their engine up through
``engine_lease``; an engine's ``up`` sweeps leftovers of its kind and its ``down`` removes
all of them. Here two real pytest sessions run at once, each with a module-scoped fixture
of that shape (an "engine" that is a directory, swept by prefix as the fake hosts'
namespaces are), the second starting while the first is up: held, both pass and their
lives do not overlap; unheld (the control), one finds its engine swept away.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT

ENGINE = '''
"""A stand-in engine: up sweeps every engine-* directory (as FakeHosts.up sweeps every
namespace of its prefix), then makes its own; down removes every one."""
import os, shutil, time
from pathlib import Path

HOME = Path(os.environ["ENGINE_HOME"])

def unavailable():
    return None

def up():
    down()
    mine = HOME / f"engine-{os.getpid()}"
    mine.mkdir()
    (HOME / f"life-{os.getpid()}").write_text(f"{time.time()}")

def down():
    for path in HOME.glob("engine-*"):
        shutil.rmtree(path, ignore_errors=True)
    life = HOME / f"life-{os.getpid()}"
    if life.exists():
        life.write_text(life.read_text() + f" {time.time()}")
'''

CONFTEST = '''
import os
import pytest
import engine_lease
import stand_in_engine

@pytest.fixture(scope="module")
def engine():
    if os.environ["HELD"] == "1":
        yield from engine_lease.engine_while_needed(
            "stand-in", stand_in_engine, lambda: stand_in_engine.HOME, lock=os.environ["LOCK"])
    else:
        stand_in_engine.up()
        yield stand_in_engine.HOME
        stand_in_engine.down()
'''

TEST = '''
import os, time

def test_my_engine_lives_until_my_test_ends(engine):
    (engine / f"arrived-{os.getpid()}").write_text("")
    deadline = time.monotonic() + float(os.environ["OVERLAP_S"])
    while len(list(engine.glob("arrived-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # the other session has arrived, or cannot (it waits to hold it)
    time.sleep(0.3)
    assert (engine / f"engine-{os.getpid()}").is_dir(), "my engine was swept by another"
'''


def _two_sessions_at_once(tmp_path: Path, held: bool,
                          overlap_s: float) -> tuple[list[str], list[tuple[float, ...]]]:
    """The two sessions' outputs, and each engine's (up, down) times, earliest first."""
    home, code = tmp_path / "home", tmp_path / "code"
    home.mkdir()
    code.mkdir()
    (code / "stand_in_engine.py").write_text(ENGINE)
    (code / "conftest.py").write_text(CONFTEST)
    (code / "test_stand_in.py").write_text(TEST)
    (code / "pytest.ini").write_text("[pytest]\n")  # not the project's addopts (-n 3)
    env = {**os.environ, "ENGINE_HOME": str(home), "HELD": "1" if held else "0",
           "LOCK": f"stand-in-{os.getpid()}-{tmp_path.name}", "OVERLAP_S": str(overlap_s),
           "PYTHONPATH": os.pathsep.join([str(code), str(ROOT / "tests")])}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
               str(code / "test_stand_in.py")]
    sessions = [subprocess.Popen(command, cwd=code, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)]
    time.sleep(0.5)  # the second starts while the first is up or coming up
    sessions.append(subprocess.Popen(command, cwd=code, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True))
    outputs = [session.communicate(timeout=120)[0] for session in sessions]
    lives = sorted(tuple(map(float, path.read_text().split())) for path in home.glob("life-*"))
    return outputs, lives


def test_two_holders_of_an_engine_take_turns_and_neither_loses_it(tmp_path):
    outputs, lives = _two_sessions_at_once(tmp_path, held=True, overlap_s=2.0)
    assert all("1 passed" in out for out in outputs), outputs
    assert len(lives) == 2 and all(len(life) == 2 for life in lives), lives
    (_, first_down), (second_up, _) = lives
    assert first_down <= second_up, f"the two engines were up at once: {lives}"


def test_without_the_lease_the_second_holder_sweeps_the_first_s_engine(tmp_path):
    """The control: the stand-in test can fail (it sees its engine swept)."""
    outputs, _ = _two_sessions_at_once(tmp_path, held=False, overlap_s=60.0)
    assert any("my engine was swept by another" in out for out in outputs), outputs


GROUPED = '''
import os, pytest

@pytest.mark.xdist_group("engine")
@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    print("WORKER", os.environ["PYTEST_XDIST_WORKER"])
'''


def test_the_installed_pytest_and_xdist_keep_an_xdist_group_on_one_worker(tmp_path):
    """The engines' groups (conftest.ENGINE_FOLDERS) are what keeps their tests from
    waiting on each other's lease; pytest 9 with xdist 3.8 drops them (pyproject.toml
    bounds pytest below 9 for that). If a release breaks grouping, this says so first."""
    pytest.importorskip("xdist")
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "3",
                           "--dist", "loadgroup", "-s", "-v", str(tmp_path)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]
    ran_on = {line.split()[0] for line in done.stdout.splitlines()
              if "PASSED" in line and line.startswith("[gw")}
    assert len(ran_on) == 1, f"one xdist group ran on {sorted(ran_on)}:\n{done.stdout[-3000:]}"
