"""A script that configures its own logical CPUs (issue 12.10).

    tfrun --devices 2 own_devices.py
"""

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 3)
print(f"own_devices: {tf.distribute.MirroredStrategy().num_replicas_in_sync} replicas", flush=True)
