"""A plain Keras 3 model with no call(), only a train_step that trains two sub-models against
each other with two optimizers (the shape of keras.io's GAN and distiller guides), made in
a strategy's scope: MultiWorkerMirroredStrategy when TF_CONFIG names a cluster, else
MirroredStrategy on one CPU (``scope``) or no strategy (``alone``). Deterministic: the
"noise" is drawn from the data, the weights are fixed. Prints ``history {json}``.

    python pair_without_call.py alone|scope
    tfrun --workers 2 pair_without_call.py
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

import keras

if os.environ.get("TF_CONFIG"):
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
elif sys.argv[1:] == ["scope"]:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
else:
    strategy = tf.distribute.get_strategy()


class Pair(keras.Model):
    def __init__(self, generator, critic):
        super().__init__()
        self.generator, self.critic = generator, critic
        self.critic_loss = keras.metrics.Mean(name="critic_loss")

    def compile(self, critic_optimizer, generator_optimizer, loss_fn):
        super().compile()
        self.critic_optimizer, self.generator_optimizer = critic_optimizer, generator_optimizer
        self.loss_fn = loss_fn

    @property
    def metrics(self):
        return [self.critic_loss]

    def train_step(self, real):
        n = tf.shape(real)[0]
        seed = real[:, :2] * 0.5
        x = tf.concat([self.generator(seed), real], 0)
        labels = tf.concat([tf.ones((n, 1)), tf.zeros((n, 1))], 0)
        with tf.GradientTape() as tape:
            critic_loss = self.loss_fn(labels, self.critic(x))
        grads = tape.gradient(critic_loss, self.critic.trainable_weights)
        self.critic_optimizer.apply_gradients(zip(grads, self.critic.trainable_weights))
        with tf.GradientTape() as tape:
            fooled = self.loss_fn(tf.zeros((n, 1)), self.critic(self.generator(seed)))
        grads = tape.gradient(fooled, self.generator.trainable_weights)
        self.generator_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        self.critic_loss.update_state(critic_loss * self.distribute_strategy.num_replicas_in_sync)
        return {"critic_loss": self.critic_loss.result()}


rng = np.random.default_rng(0)
data = rng.normal(size=(64, 4)).astype("float32")
with strategy.scope():
    generator = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4)])
    critic = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    generator.set_weights([rng.normal(scale=0.5, size=(2, 4)).astype("float32"),
                           np.zeros(4, "float32")])
    critic.set_weights([rng.normal(scale=0.5, size=(4, 1)).astype("float32"),
                        np.zeros(1, "float32")])
    pair = Pair(generator, critic)
    pair.compile(keras.optimizers.SGD(0.05), keras.optimizers.SGD(0.05),
                 keras.losses.BinaryCrossentropy(from_logits=True))
history = pair.fit(tf.data.Dataset.from_tensor_slices(data).batch(16), epochs=2,
                   verbose=0).history
print("history " + json.dumps({k: [float(v) for v in vs] for k, vs in history.items()}),
      flush=True)
