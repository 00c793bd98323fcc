"""Parameter-server training helpers (strategy construction; the trainer lives in train.py)."""

from __future__ import annotations

__all__ = ["make_parameter_server_strategy"]


def make_parameter_server_strategy():
    """ParameterServerStrategy for the coordinator (chief), from TF_CONFIG.

    TF_CONFIG's cluster never lists the evaluator (tfrun's canonical form), so the
    coordinator only connects to chief, workers and ps.
    """
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if not resolver.rpc_layer:
        resolver.rpc_layer = "grpc"
    return tf.distribute.ParameterServerStrategy(resolver)
