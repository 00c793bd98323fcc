"""Starts this task's TensorFlow server, reports to a server on the host's loopback, waits.

    python network_probe.py HOST_PORT GO_FILE

The host's 127.0.0.1 is TFRUN_HOST_LOOPBACK inside a private network, 127.0.0.1 outside.
The task keeps its server up until GO_FILE exists, so the test can look at the sockets.
"""

import os
import socket
import sys
import time
from pathlib import Path

import tfrun

strategy = tfrun.strategy()  # MultiWorkerMirroredStrategy: starts this task's gRPC server
host = os.environ.get("TFRUN_HOST_LOOPBACK", "127.0.0.1")
me = f"{os.environ['TFRUN_TASK_TYPE']}:{os.environ['TFRUN_TASK_INDEX']}"
with socket.create_connection((host, int(sys.argv[1])), timeout=20) as conn:
    conn.sendall(f"{me}\n".encode())
    print("host loopback answered:", conn.recv(64).decode().strip(), flush=True)
while not Path(sys.argv[2]).exists():
    time.sleep(0.1)
