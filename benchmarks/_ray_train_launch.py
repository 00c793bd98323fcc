"""Ray Train's way (the baseline users have today): TensorflowTrainer, 2 workers.

    python _ray_train_launch.py RAY_ADDRESS OUT_DIR

Ray Train builds TF_CONFIG itself and sets TF_USE_LEGACY_KERAS=1 in every worker (Keras 3
under MWMS fails in it: measured here, ``tf.keras`` in the loop is still Keras 3 and fit()
raises the PerReplica error), so the loop uses tf_keras explicitly.
"""

import os
import sys

import ray
from ray import cloudpickle
from ray.train import RunConfig, ScalingConfig
from ray.train.tensorflow import TensorflowTrainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _ray_job  # noqa: E402

cloudpickle.register_pickle_by_value(_ray_job)  # the workers cannot import benchmarks/
address, out_dir = sys.argv[1], sys.argv[2]


def loop(config):
    import tensorflow as tf
    import tf_keras

    from ray import train

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    _ray_job.train(strategy, tf_keras, config["out"], train.get_context().get_world_rank())


ray.init(address=address, logging_level="ERROR", log_to_driver=False)
TensorflowTrainer(loop, train_loop_config={"out": out_dir},
                  scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
                  run_config=RunConfig(storage_path=out_dir, name="raytrain")).fit()
