"""Every task runs through here: ``python -m tfrun.in_task.start.bootstrap (script.py | -m module) [args]``.

In order, before the user's code:

1. die with the supervisor (``PR_SET_PDEATHSIG``), so a SIGKILLed tfrun leaves no task,
   move into the task's cgroup (``contract.CGROUP``, see ``tfrun.in_task.start.isolation``) and join
   the run's private network (``contract.NETNS``, see ``tfrun.in_task.start.isolation``); in a pod of a
   ``tfrun k8s`` JobSet, make TF_CONFIG from what JobSet gave the pod and wait for every
   peer's DNS name (``tfrun.launch.engines.kubernetes``; a TFJob pod's TF_CONFIG is normalised);
2. dump every thread's Python stack on SIGUSR1 (``faulthandler``: works even when the
   main thread is stuck in C code), which the hang clocks ask for, and on a crash (a fatal
   signal: the launcher shows it as the crash's evidence); split the CPU into
   logical devices when ``contract.DEVICES`` is set;
3. install the Keras compatibility fixes (applied when Keras is first imported, so a
   script that never imports Keras pays nothing); keep Python's garbage collector from
   walking TensorFlow's heap while it imports and when the task exits
   (``tfrun.in_task.start.collector``); leave Keras 3's scikit-learn wrappers, plotting helpers
   and IPython to the script's first use of them (``tfrun.in_task.compat.deferred_imports``);
4. with ``contract.ROLES=auto`` in a parameter-server cluster, ps and worker tasks become
   plain ``tf.distribute.Server``s and never run the script;
5. run the script as ``__main__`` with ``sys.argv`` as if started by ``python script.py``.

The bootstrap reads only environment variables, so a task started by hand with the
same environment behaves the same.
"""

from __future__ import annotations

import faulthandler
import os
import runpy
import signal
import sys
from typing import Callable

from ... import contract

__all__ = ["main"]


def _die_with_supervisor() -> None:
    supervisor = os.environ.get(contract.SUPERVISOR_PID)
    if supervisor:
        _die_with(int(supervisor))


def _die_with(parent: int) -> None:
    """SIGKILL this process when its parent ``parent`` dies (at once if it already has)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - exotic libc
        return
    # The parent may have died between our fork and the prctl above.
    if os.getppid() != parent:
        os._exit(128 + signal.SIGKILL)


def _join_or_exit(join_from_env: Callable[[], None], what: str, fix: str = "") -> None:
    """Join what the launcher prepared for this task, or exit 1.

    Never run a task outside what was promised for it: uncontained, its helpers could
    outlive the run; outside its private network, its server would be open.
    """
    try:
        join_from_env()
    except OSError as exc:
        print(f"tfrun: this task could not join {what} ({exc}){fix}", file=sys.stderr)
        os._exit(1)


def _join_cgroup() -> None:
    if os.environ.get(contract.CGROUP):  # imports only when there is something to join
        from .isolation import join_cgroup

        _join_or_exit(join_cgroup, f"its cgroup {os.environ[contract.CGROUP]}")


def _join_private_network() -> None:
    if os.environ.get(contract.NETNS):
        from .isolation import join_network

        _join_or_exit(join_network, "the run's private network",
                      "; rerun with --network host to run without one")


def _tf_config_from_kubernetes() -> None:
    """In a pod of a ``tfrun k8s`` manifest: make TF_CONFIG (JobSet) or normalise the
    operator's (TFJob), then wait until every peer's DNS name resolves."""
    if os.environ.get(contract.K8S_ROLES) and not os.environ.get("TF_CONFIG"):
        from ...errors import ConfigError
        from .pod import jobset_tf_config, wait_for_peers

        try:
            config = jobset_tf_config(os.environ)
        except ConfigError as exc:
            print(f"tfrun: error: {exc}", file=sys.stderr)
            os._exit(2)
        os.environ["TF_CONFIG"] = config.to_json()  # type: ignore[union-attr]
        os.environ[contract.TASK_TYPE] = config.task.role  # type: ignore[union-attr]
        os.environ[contract.TASK_INDEX] = str(config.task.index)  # type: ignore[union-attr]
        unresolved = wait_for_peers(config, float(os.environ.get(contract.K8S_DNS_TIMEOUT, "300")))
        if unresolved:
            print(f"tfrun: error: these pods' DNS names never resolved: {', '.join(unresolved)} "
                  "(is the JobSet's enableDNSHostnames on and every pod scheduled?)",
                  file=sys.stderr)
            os._exit(1)
    elif os.environ.get(contract.K8S_KIND) == "tfjob" and os.environ.get("TF_CONFIG"):
        from ...cluster import parse_tf_config

        # training-operator writes "master" for a Master replica, which TF2 rejects.
        os.environ["TF_CONFIG"] = parse_tf_config(os.environ["TF_CONFIG"]).to_json()


def _run_user_code(argv: list[str]) -> None:
    if not argv:
        print("usage: python -m tfrun.in_task.start.bootstrap (script.py | -m module) [args]", file=sys.stderr)
        raise SystemExit(2)
    if argv[0] == "-m":
        if len(argv) < 2:
            print("tfrun.in_task.start.bootstrap: -m needs a module name", file=sys.stderr)
            raise SystemExit(2)
        sys.argv = [argv[1], *argv[2:]]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        script = argv[0]
        sys.argv = [script, *argv[1:]]
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        runpy.run_path(script, run_name="__main__")


def _pin_cpus() -> None:
    """``--cpus-per-task``: this task's own CPUs, before TensorFlow makes its threads."""
    cpus = os.environ.get(contract.CPUS)
    if cpus:
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    _die_with_supervisor()
    _pin_cpus()
    _join_cgroup()
    _join_private_network()
    _tf_config_from_kubernetes()
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    # A crash in native code (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) leaves the Python
    # stack where it happened in the log: the launcher shows it as the crash's evidence.
    faulthandler.enable(file=sys.stderr, all_threads=True)
    from . import collector
    from . import setup as task_setup
    from ..compat import deferred_imports

    tune_collector = collector.wanted()
    if tune_collector:
        collector.quiet_during_import()
    if deferred_imports.wanted():
        deferred_imports.install()
    try:
        task_setup.prepare()
        if task_setup.run_as_server_if_assigned():
            return
        try:
            _run_user_code(argv)
        except Exception as exc:  # noqa: BLE001 - re-reported, then exit 1 like python would
            _print_user_traceback(exc)
            sys.exit(1)
    finally:
        if tune_collector:
            collector.before_exit()


def _print_user_traceback(exc: BaseException) -> None:
    """Print the traceback as ``python script.py`` would: without bootstrap/runpy frames;
    then tell the launcher what ended the script (a ``TaskError`` record: it classifies
    the failure and quotes it from that, not from the log's text)."""
    import time
    import traceback

    from ...records import TaskError
    from ..measure.metrics import record_error

    tb = exc.__traceback__
    while tb is not None and _is_launcher_frame(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)
    sys.stderr.flush()
    record_error(TaskError.of(exc.with_traceback(tb), time.time()))


def _is_launcher_frame(filename: str) -> bool:
    return filename == __file__ or filename.startswith("<frozen runpy") or filename.endswith("runpy.py")


if __name__ == "__main__":
    main()
