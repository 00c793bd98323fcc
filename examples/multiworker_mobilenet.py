"""The tf.distribute multi-worker tutorial (MobileNetV2), under tfrun.

    tfrun --workers 2 examples/multiworker_mobilenet.py

Changed from the tutorial: no hand-written TF_CONFIG (tfrun sets it on every worker), and the
data: cats_vs_dogs via tensorflow_datasets at 224x224 becomes scikit-learn's digits at
32x32 RGB with a few steps (`--data tfds` keeps the real loader for machines that have
the data set). ``weights=None``: the tutorial's default ImageNet weights would be a download.
"""

import argparse

import tensorflow as tf

from _data import load

parser = argparse.ArgumentParser()
parser.add_argument("--data", default="digits", choices=["digits", "tfds"])
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--steps", type=int, default=6, help="batches per epoch (digits)")
args = parser.parse_args()

num_epochs = args.epochs
batch_size_per_replica = 16
learning_rate = 0.001

strategy = tf.distribute.experimental.MultiWorkerMirroredStrategy()
print(f"{type(strategy).__name__}: {strategy.num_replicas_in_sync} replicas")
batch_size = batch_size_per_replica * strategy.num_replicas_in_sync

if args.data == "tfds":
    import tensorflow_datasets as tfds

    def resize(image, label):
        image = tf.image.resize(image, [224, 224]) / 255.0
        return image, label

    dataset = tfds.load("cats_vs_dogs", split=tfds.Split.TRAIN, as_supervised=True)
    dataset = dataset.map(resize).shuffle(1024).batch(batch_size)
    input_shape = (224, 224, 3)
else:
    (x_train, y_train), _ = load("digits", flat=False, size=32, channels=3)
    dataset = (tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(1024, seed=0)
               .batch(batch_size).take(args.steps))
    input_shape = (32, 32, 3)

with strategy.scope():
    model = tf.keras.applications.MobileNetV2(input_shape=input_shape, weights=None)
    model.compile(
        optimizer=tf.keras.optimizers.Adam(learning_rate=learning_rate),
        loss=tf.keras.losses.sparse_categorical_crossentropy,
        metrics=[tf.keras.metrics.sparse_categorical_accuracy]
    )

history = model.fit(dataset, epochs=num_epochs, verbose=2)
print("final loss:", history.history["loss"][-1])
