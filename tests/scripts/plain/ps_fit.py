"""The standard parameter-server pattern, ported to Keras 3 as written (issue 12.3):
servers started by the script, model.fit on a dataset function, model.evaluate.

    tfrun --chief --workers 2 --ps 1 ps_fit.py
"""

import json

import numpy as np
import tensorflow as tf

import keras

resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
if resolver.task_type in ("worker", "ps"):
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                  task_index=resolver.task_id, protocol="grpc", start=True)
    server.join()
strategy = tf.distribute.ParameterServerStrategy(resolver)

rng = np.random.default_rng(0)
x = rng.normal(size=(512, 8)).astype("float32")
y = (x.sum(axis=1) > 0).astype("int32")


def dataset_fn(input_context):
    batch = input_context.get_per_replica_batch_size(64)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(512).repeat().batch(batch)
    return ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)


with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.1), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(strategy.distribute_datasets_from_function(dataset_fn), epochs=4,
                    steps_per_epoch=20,
                    validation_data=tf.data.Dataset.from_tensor_slices((x, y)).batch(128))
result = model.evaluate(tf.data.Dataset.from_tensor_slices((x, y)).batch(128), return_dict=True)
try:
    model.fit(x, y, batch_size=32, epochs=1)
    misuse = "no error"
except Exception as exc:  # noqa: BLE001 - the test checks which error and its message
    misuse = f"{type(exc).__name__}: {exc}"
print("PS_FIT " + json.dumps({"history": history.history, "evaluate": result, "misuse": misuse}),
      flush=True)
