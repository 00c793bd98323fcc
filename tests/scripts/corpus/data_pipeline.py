"""A tf.data input pipeline as performance guides write it: from files (one shard of
records each), interleaved, cached, shuffled with a seed, batched, prefetched; sharding by
data set explicitly in the options."""

import json
import os
import tempfile

import numpy as np
import tensorflow as tf

import keras

strategy = (tf.distribute.MultiWorkerMirroredStrategy() if os.environ.get("TF_CONFIG")
            else tf.distribute.get_strategy())
rng = np.random.default_rng(0)
x = rng.normal(size=(128, 8)).astype("float32")
y = (x[:, :4].sum(1) > 0).astype("int64")
files = []
folder = tempfile.mkdtemp()
for i in range(4):  # four record files, as a real input pipeline reads
    path = os.path.join(folder, f"part-{i}.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for features, label in zip(x[i::4], y[i::4]):
            example = tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=features)),
                "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}))
            writer.write(example.SerializeToString())
    files.append(path)
spec = {"x": tf.io.FixedLenFeature([8], tf.float32), "y": tf.io.FixedLenFeature([1], tf.int64)}


def parse(record):
    parsed = tf.io.parse_single_example(record, spec)
    return parsed["x"], parsed["y"]


options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
data = (tf.data.Dataset.from_tensor_slices(files)
        .interleave(tf.data.TFRecordDataset, cycle_length=4, deterministic=True)
        .map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .cache()
        .shuffle(128, seed=7, reshuffle_each_iteration=False)
        .batch(16)
        .prefetch(tf.data.AUTOTUNE)
        .with_options(options))
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    model.set_weights([rng.normal(scale=0.3, size=w.shape).astype("float32")
                       for w in model.get_weights()])
    model.compile(keras.optimizers.SGD(0.1),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(data, epochs=2, verbose=0).history
print("history " + json.dumps({k: [float(v) for v in vs] for k, vs in history.items()}),
      flush=True)
