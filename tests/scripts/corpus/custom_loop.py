"""A custom training loop: strategy.run of a step that computes a per-example loss,
averages it over the global batch (tf.nn.compute_average_loss) and applies the gradients;
the per-replica losses are summed with strategy.reduce."""

import json
import os

import numpy as np
import tensorflow as tf

import keras

strategy = (tf.distribute.MultiWorkerMirroredStrategy() if os.environ.get("TF_CONFIG")
            else tf.distribute.get_strategy())
GLOBAL_BATCH = 16
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 8)).astype("float32")
y = (x[:, :4].sum(1) > 0).astype("int32")
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    model.set_weights([rng.normal(scale=0.3, size=w.shape).astype("float32")
                       for w in model.get_weights()])
    optimizer = keras.optimizers.SGD(0.1)
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                              reduction="none")
data = strategy.experimental_distribute_dataset(
    tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH))


@tf.function
def train_step(batch):
    def step(inputs, labels):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(per_example(labels, model(inputs, training=True)),
                                              global_batch_size=GLOBAL_BATCH)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return strategy.reduce("SUM", strategy.run(step, args=batch), axis=None)


losses = []
for epoch in range(2):
    total, steps = 0.0, 0
    for batch in data:
        total += float(train_step(batch))
        steps += 1
    losses.append(total / steps)
print("history " + json.dumps({"loss": losses}), flush=True)
