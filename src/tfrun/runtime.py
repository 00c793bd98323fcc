"""Runtime helpers used inside a training script (filled in by the Keras runtime work)."""

from __future__ import annotations

__all__ = ["configure_logical_devices"]


def configure_logical_devices(count: int) -> None:
    """Split the first physical CPU into ``count`` logical devices (before TF initialises).

    Lets MirroredStrategy / CentralStorageStrategy run with several replicas on any
    machine (``tfrun --devices 2``).
    """
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(count)])
