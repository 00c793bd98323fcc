"""Per-task set-up done by the bootstrap (internal).

Kept apart from ``bootstrap`` so each step can be tested on its own. Nothing here
imports TensorFlow unless the environment asks for something that needs it.
"""

from __future__ import annotations

import json
import os
import sys

__all__ = ["prepare", "run_as_server_if_assigned"]


def prepare() -> None:
    if os.environ.get("TFRUN_DEVICES"):
        from .runtime import configure_logical_devices

        configure_logical_devices(int(os.environ["TFRUN_DEVICES"]))
    try:
        from . import compat
    except ImportError:  # pragma: no cover - compat arrives with the Keras runtime
        return
    compat.install()


def _server_role() -> tuple[str, int, dict] | None:
    """(role, index, cluster) when this task should only serve, else None."""
    if os.environ.get("TFRUN_ROLES", "auto") != "auto":
        return None
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return None
    from .cluster import parse_tf_config

    config = parse_tf_config(raw)
    cluster = config.cluster
    if not cluster.ps or not cluster.chief or config.task.role not in ("ps", "worker"):
        return None
    return config.task.role, config.task.index, cluster.as_dict()


def run_as_server_if_assigned() -> bool:
    """In a PS cluster with ``--roles auto``: ps and workers serve until stopped."""
    role = _server_role()
    if role is None:
        return False
    task_type, index, cluster = role
    import tensorflow as tf

    print(f"tfrun: {task_type}:{index} serving as a tf.distribute.Server "
          f"(cluster {json.dumps(cluster)})", flush=True)
    server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=task_type,
                                  task_index=index, protocol="grpc", start=True)
    sys.stdout.flush()
    server.join()  # returns only when the process is stopped by the supervisor
    return True
