"""Knowledge distillation: a fixed teacher and a student, a model whose train_step mixes
the student's loss with a KL term to the teacher's softened outputs (keras.io's distiller
shape); the model delegates call() to the student."""

import json
import os

import numpy as np
import tensorflow as tf

import keras

strategy = (tf.distribute.MultiWorkerMirroredStrategy() if os.environ.get("TF_CONFIG")
            else tf.distribute.get_strategy())


class Distiller(keras.Model):
    def __init__(self, student, teacher, temperature=3.0, alpha=0.3):
        super().__init__()
        self.student, self.teacher = student, teacher
        self.temperature, self.alpha = temperature, alpha
        self.student_loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        self.distill_loss_fn = keras.losses.KLDivergence()
        self.total = keras.metrics.Mean(name="total_loss")

    def call(self, x):
        return self.student(x)

    @property
    def metrics(self):
        return [self.total]

    def train_step(self, data):
        x, y = data
        teacher_logits = self.teacher(x, training=False)
        with tf.GradientTape() as tape:
            logits = self.student(x, training=True)
            t = self.temperature
            loss = (self.alpha * self.student_loss_fn(y, logits)
                    + (1 - self.alpha) * self.distill_loss_fn(
                        tf.nn.softmax(teacher_logits / t), tf.nn.softmax(logits / t)) * t * t)
        grads = tape.gradient(loss, self.student.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.student.trainable_variables))
        # Keras' losses divide by the replicas in sync: show what one process shows.
        self.total.update_state(loss * self.distribute_strategy.num_replicas_in_sync)
        return {"total_loss": self.total.result()}


rng = np.random.default_rng(0)
x = rng.normal(size=(64, 8)).astype("float32")
y = (x[:, :4].sum(1) > 0).astype("int32")
with strategy.scope():
    teacher = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
                                keras.layers.Dense(2)])
    student = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"),
                                keras.layers.Dense(2)])
    for net in (teacher, student):
        net.set_weights([rng.normal(scale=0.3, size=w.shape).astype("float32")
                         for w in net.get_weights()])
    distiller = Distiller(student, teacher)
    distiller.compile(optimizer=keras.optimizers.Adam(0.01))
history = distiller.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=2,
                        verbose=0).history
print("history " + json.dumps({k: [float(v) for v in vs] for k, vs in history.items()}),
      flush=True)
