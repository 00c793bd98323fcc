"""A tiny stand-in for a training task (no TensorFlow), driven by its arguments.

    python fake_task.py 'worker:1=raise;worker=listen,sleep:1;*=ok'

Rules are ``selector=action,action,...`` separated by ``;``; the selector is
``role:index``, ``role`` or ``*`` (first match wins). Actions run in order:

  ok | exit:N | raise | sleep:S | forever | listen | kill:SIG | grandchild | escaped_child
  | spam (print 1 KB lines forever) | fail_before_restart:N (exit 1 while
  TFRUN_RESTART_COUNT < N) | preempt_before_restart:N (die of SIGTERM, as a preempted
  node's process does, while TFRUN_RESTART_COUNT < N) | fail_twice_then_ok (raise an
  error that names the restart while TFRUN_RESTART_COUNT < 2) | wait_done
  | print:TEXT | usage_error (exit 2) | set_tf_config (the script assigns its own TF_CONFIG)
  | tick (print a line every 0.2 s forever) | hang_in_python (silent forever)
  | watch_stop_before_restart:N (as tfrun's preemption watch ending a task without its
  backup: its "stopped" metrics event, then death by SIGTERM, while TFRUN_RESTART_COUNT < N)
  | ignore_sigterm (a task whose backup takes longer than any grace)
  | tempfile (make a file with Python's tempfile and write its path to the run dir's
  ``tempfile-<role>-<index>.path``)
  | raise_layer_error (a Keras-like ValueError: a coloured first line, the arguments
  after it, and a line printed at exit after the traceback)
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

role = os.environ.get("TFRUN_TASK_TYPE", "worker")
index = os.environ.get("TFRUN_TASK_INDEX", "0")
restart = int(os.environ.get("TFRUN_RESTART_COUNT", "0"))
held = []


def actions_for(spec: str) -> list[str]:
    for rule in spec.split(";"):
        selector, _, actions = rule.partition("=")
        if selector in (f"{role}:{index}", role, "*"):
            return [a for a in actions.split(",") if a]
    return ["ok"]


def my_port() -> int:
    config = json.loads(os.environ["TF_CONFIG"])
    return int(config["cluster"][role][int(index)].rsplit(":", 1)[1])


def hang_in_python() -> None:
    while True:
        time.sleep(0.1)


def run(action: str) -> None:
    name, _, arg = action.partition(":")
    if name == "ok":
        sys.exit(0)
    if name == "exit":
        sys.exit(int(arg))
    if name == "usage_error":
        print("usage: bad flag", file=sys.stderr)
        sys.exit(2)
    if name == "raise":
        raise RuntimeError(f"fake failure in {role}:{index}")
    if name == "raise_layer_error":
        import atexit

        atexit.register(print, "[cellrun] cell 95 OK", flush=True)
        raise ValueError("\x1b[1mInput 0 of layer 'dense' is incompatible\x1b[0m: expected "
                         "shape (None, 6)\n\nArguments received by Sampling.call():\n"
                         "  - inputs=tf.Tensor(shape=(8, 4), dtype=float32)")
    if name == "sleep":
        time.sleep(float(arg))
    if name == "forever":
        while True:
            time.sleep(1)
    if name == "listen":
        # What a TensorFlow server does: bind its port with SO_REUSEPORT and listen.
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("0.0.0.0", my_port()))
        sock.listen()
        held.append(sock)
    if name == "kill":
        os.kill(os.getpid(), getattr(signal, arg))
        time.sleep(5)
    if name == "grandchild":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        Path(os.environ["TFRUN_RUN_DIR"], f"grandchild-{role}-{index}.pid").write_text(str(child.pid))
    if name == "tick":
        while True:
            print("tick", flush=True)
            time.sleep(0.2)
    if name == "hang_in_python":
        hang_in_python()
    if name == "set_tf_config":
        os.environ["TF_CONFIG"] = os.environ["TF_CONFIG"]  # the same cluster: no warning
        own = {"cluster": {role: [f"localhost:{20000 + i}" for i in range(int(index) + 1)]},
               "task": {"type": role, "index": int(index)}}
        os.environ["TF_CONFIG"] = json.dumps(own)
    if name == "spam":
        n = 0
        while True:
            n += 1
            print(f"spam {n} " + "x" * 1000, flush=True)
    if name == "tempfile":
        import tempfile

        fd, path = tempfile.mkstemp(prefix="fake-task-")
        os.write(fd, b"left by a task that never cleans up")
        Path(os.environ["TFRUN_RUN_DIR"], f"tempfile-{role}-{index}.path").write_text(path)
    if name == "escaped_child":
        # A helper in a session of its own (setsid), outside the task's process group.
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                                 start_new_session=True)
        Path(os.environ["TFRUN_RUN_DIR"], f"escaped-{role}-{index}.pid").write_text(str(child.pid))
    if name == "fail_before_restart" and restart < int(arg):
        print(f"failing on purpose at restart {restart}", flush=True)
        sys.exit(1)
    if name == "preempt_before_restart" and restart < int(arg):
        print(f"preempted on purpose at restart {restart}", flush=True)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    if name == "watch_stop_before_restart" and restart < int(arg):
        print('tfrun:metrics {"event": "stopped", "step": 7, "reason": "stalled", '
              '"doing": "a training step"}', flush=True)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    if name == "ignore_sigterm":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if name == "fail_twice_then_ok" and restart < 2:
        raise ValueError(f"a different failure at restart {restart}")
    if name == "wait_done":
        marker = Path(os.environ["TFRUN_RUN_DIR"], ".tfrun", "training_done")
        while not marker.exists():
            time.sleep(0.05)
        print("evaluator: final evaluation done", flush=True)
        sys.exit(0)
    if name == "print":
        print(arg, flush=True)


print(f"fake {role}:{index} restart {restart} pid {os.getpid()}", flush=True)
for step in actions_for(sys.argv[1] if len(sys.argv) > 1 else "*=ok"):
    run(step)
