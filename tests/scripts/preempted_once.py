"""A task that is preempted on its first start and finishes on the next.

    python preempted_once.py MARKS_DIR

First start: writes MARKS_DIR/first and waits (to be preempted). Any later start (the
first file exists): writes MARKS_DIR/second with $SLURM_RESTART_COUNT and exits 0.
"""

import os
import sys
import time
from pathlib import Path

marks = Path(sys.argv[1])
if (marks / "first").exists():
    (marks / "second").write_text(os.environ.get("SLURM_RESTART_COUNT", "unset"))
    print("second start: done", flush=True)
    sys.exit(0)
(marks / "first").write_text(os.environ.get("TFRUN_RUN_DIR", "unset"))
print("first start: waiting to be preempted", flush=True)
time.sleep(600)
