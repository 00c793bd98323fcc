"""``tfrun slurm --nodes N [...] [tfrun args]``: a ready batch script for sbatch.

The script asks for whole nodes (or ``--cpus-per-node``) and runs one tfrun command, as
given, which places the cluster on the allocation when the job runs. It survives the end
of its time slot and preemption: the job may be requeued (``--requeue``), Slurm warns the
script ``--notice`` seconds before the time limit (``--signal=B:USR1@N``) and the script
turns the warning into a preemption notice: it sends tfrun SIGTERM (the tasks back up at
one step with ``tfrun.backup_and_restore``, stop, and the run is marked interrupted),
waits for tfrun to end -- the whole notice is there for the save, not only Slurm's
``KillWait`` -- then requeues its own job. Slurm starts the job again later, whose same
tfrun line resumes in the run directory the job id names (``runs/slurm-<id>-<name>``)
from the run's backups. A job preempted by Slurm itself (``PreemptMode=REQUEUE``) gets
SIGTERM directly and comes back the same way. Output of every start goes to the same
file (``--open-mode=append``).
"""

from __future__ import annotations

import argparse
import shlex
from typing import Sequence

from ....errors import ConfigError
from ....flags import non_negative_int

__all__ = ["DEFAULT_NOTICE", "run_sbatch_script", "sbatch_script"]

#: Seconds of warning before the time limit: enough for the tasks to stop and save.
DEFAULT_NOTICE = 120


def _build_sbatch_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfrun slurm",
        usage="tfrun slurm --nodes N [--time T] [--partition P] [--gpus-per-node G] "
              "[--cpus-per-node C] [--job-name NAME] [--notice S] [tfrun options] "
              "script.py [args]",
        description="Print a ready sbatch script: the directives and the one tfrun line. "
                    "These options come first; everything after them is the tfrun line.",
        epilog="example:\n  tfrun slurm --nodes 2 --time 1:00:00 examples/mnist_mlp.py > job.sh"
               " && sbatch job.sh",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=non_negative_int, required=True)
    parser.add_argument("--time", default=None, help="wall-clock limit, e.g. 1:00:00")
    parser.add_argument("--partition", default=None)
    parser.add_argument("--gpus-per-node", type=non_negative_int, default=None)
    parser.add_argument("--cpus-per-node", type=non_negative_int, default=None,
                        help="CPUs per node (default: --exclusive, the whole node)")
    parser.add_argument("--job-name", default=None, help="default: the script's name")
    parser.add_argument("--output", default="slurm-%j.out", help="default slurm-%%j.out")
    parser.add_argument("--notice", type=non_negative_int, default=DEFAULT_NOTICE,
                        help="seconds before the time limit at which the job stops tfrun "
                             "(the tasks back up) and requeues itself, to resume later "
                             f"(default {DEFAULT_NOTICE}; "
                             "Slurm is exact to about a minute); 0: no requeue")
    return parser


def run_sbatch_script(argv: Sequence[str], parse_launch) -> int:
    """Print a batch script for sbatch; ``parse_launch`` checks the tfrun line."""
    parser = _build_sbatch_parser()
    own_flags = {s for a in parser._actions for s in a.option_strings}
    argv = list(argv)
    split = 0
    while split < len(argv):
        flag = argv[split].split("=", 1)[0]
        if flag in ("-h", "--help"):
            parser.parse_args(["--help"])
        if flag not in own_flags:
            break
        split += 1 if "=" in argv[split] else 2
    args = parser.parse_args(argv[:split])
    tfrun_args = argv[split:]
    # The tfrun line must be valid where the job runs: check it now, as tfrun will read it
    # (outside any allocation, so Slurm defaults do not apply here).
    config = parse_launch(tfrun_args, environ={})
    if args.notice and args.notice < config.preemption_grace:
        raise ConfigError(f"--notice {args.notice} is shorter than the tfrun line's "
                          f"--preemption-grace {config.preemption_grace:g}",
                          expected="a notice at least as long as the time the tasks have to "
                                   "back up after it",
                          fix=f"Pass --notice {int(config.preemption_grace) + 30} or more, or a "
                              f"smaller --preemption-grace on the tfrun line",
                          received=f"--notice {args.notice}")
    if config.min_nodes is not None and config.min_nodes > args.nodes:
        raise ConfigError(f"--min-nodes {config.min_nodes} asks for more nodes than the job "
                          f"has (--nodes {args.nodes})",
                          expected=f"a number of nodes from 1 to {args.nodes}",
                          fix=f"Pass e.g. --min-nodes {max(args.nodes - 1, 1)}, or more --nodes",
                          received=f"--min-nodes {config.min_nodes}")
    print(sbatch_script(nodes=args.nodes, tfrun_args=tfrun_args,
                        job_name=args.job_name or config.display_name, time=args.time,
                        partition=args.partition, gpus_per_node=args.gpus_per_node,
                        cpus_per_node=args.cpus_per_node, output=args.output,
                        notice=args.notice, no_kill=config.min_nodes is not None), end="")
    return 0


def sbatch_script(*, nodes: int, tfrun_args: Sequence[str], job_name: str,
                  time: str | None = None, partition: str | None = None,
                  gpus_per_node: int | None = None, cpus_per_node: int | None = None,
                  output: str = "slurm-%j.out", notice: int = DEFAULT_NOTICE,
                  no_kill: bool = False) -> str:
    """A ready batch script: the directives and the one tfrun command (see the module
    docstring; ``notice=0``: no requeue, the tfrun line alone; ``no_kill``: an elastic
    run's, which a failed node must not end: ``--no-kill``).

    >>> print(sbatch_script(nodes=2, tfrun_args=["train.py"], job_name="train"))
    #!/bin/bash
    #SBATCH --job-name=train
    #SBATCH --nodes=2
    #SBATCH --ntasks-per-node=1
    #SBATCH --exclusive
    #SBATCH --output=slurm-%j.out
    #SBATCH --open-mode=append
    #SBATCH --requeue
    #SBATCH --signal=B:USR1@120
    # tfrun places the cluster on the allocated nodes (srun starts one agent per node)
    # and exits with the failing task's exit code.
    # 120 s before the time limit Slurm sends USR1: tfrun stops (SIGTERM: the tasks back
    # up at one step), then this job is requeued; Slurm starts it again later and the same
    # command resumes in runs/slurm-<job id>-<name>. A preempted job comes back the same way.
    trap 'requeue=1; kill -TERM "$tfrun_pid"' USR1
    tfrun train.py &
    tfrun_pid=$!
    # wait returns early when the trap runs: wait again until tfrun has exited.
    wait "$tfrun_pid"; status=$?
    while kill -0 "$tfrun_pid" 2>/dev/null; do wait "$tfrun_pid"; status=$?; done
    if [ -n "${requeue:-}" ]; then scontrol requeue "$SLURM_JOB_ID"; fi
    exit "$status"
    <BLANKLINE>
    """
    if nodes < 1:
        raise ConfigError("--nodes must be at least 1", expected="a number of nodes >= 1",
                          fix="Pass e.g. --nodes 2", received=nodes)
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job_name}", f"#SBATCH --nodes={nodes}",
             "#SBATCH --ntasks-per-node=1"]
    if cpus_per_node is not None:
        lines.append(f"#SBATCH --cpus-per-task={cpus_per_node}")
    else:
        lines.append("#SBATCH --exclusive")  # the whole node: TensorFlow uses every core
    if gpus_per_node is not None:
        lines.append(f"#SBATCH --gpus-per-node={gpus_per_node}")
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if time:
        lines.append(f"#SBATCH --time={time}")
    lines.append(f"#SBATCH --output={output}")
    if no_kill:
        lines += ["#SBATCH --no-kill",
                  "# --no-kill: a failed node does not end the job; tfrun re-forms the cluster on "
                  "the nodes left (--min-nodes)"]
    command = "tfrun " + " ".join(shlex.quote(a) for a in tfrun_args)
    if not notice:
        lines += ["# tfrun places the cluster on the allocated nodes (srun starts one agent per "
                  "node)", "# and exits with the failing task's exit code.", command, ""]
        return "\n".join(lines)
    lines += [
        "#SBATCH --open-mode=append", "#SBATCH --requeue", f"#SBATCH --signal=B:USR1@{notice}",
        "# tfrun places the cluster on the allocated nodes (srun starts one agent per node)",
        "# and exits with the failing task's exit code.",
        f"# {notice} s before the time limit Slurm sends USR1: tfrun stops (SIGTERM: the tasks back",
        "# up at one step), then this job is requeued; Slurm starts it again later and the same",
        "# command resumes in runs/slurm-<job id>-<name>. A preempted job comes back the same way.",
        "trap 'requeue=1; kill -TERM \"$tfrun_pid\"' USR1",
        f"{command} &",
        "tfrun_pid=$!",
        "# wait returns early when the trap runs: wait again until tfrun has exited.",
        'wait "$tfrun_pid"; status=$?',
        'while kill -0 "$tfrun_pid" 2>/dev/null; do wait "$tfrun_pid"; status=$?; done',
        'if [ -n "${requeue:-}" ]; then scontrol requeue "$SLURM_JOB_ID"; fi',
        'exit "$status"', ""]
    return "\n".join(lines)
