"""Starts this task's TensorFlow server, asks an HTTP server on the host's loopback, waits.

    python network_probe.py HOST_PORT GO_FILE

The host's 127.0.0.1 is TFRUN_HOST_LOOPBACK inside a private network, 127.0.0.1 outside.
The task keeps its server up until GO_FILE exists, so the test can look at the sockets.
"""

import os
import sys
import time
import urllib.request
from pathlib import Path

import tfrun

strategy = tfrun.strategy()  # MultiWorkerMirroredStrategy: starts this task's gRPC server
host = os.environ.get("TFRUN_HOST_LOOPBACK", "127.0.0.1")
me = f"{os.environ['TFRUN_TASK_TYPE']}:{os.environ['TFRUN_TASK_INDEX']}"
direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy
with direct.open(f"http://{host}:{sys.argv[1]}/{me}", timeout=20) as answer:
    print("host loopback answered:", answer.read().decode().strip(), flush=True)
while not Path(sys.argv[2]).exists():
    time.sleep(0.1)
