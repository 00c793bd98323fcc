"""The multi-GPU tutorial's "Complete Multi-GPU Training Example" (CNN, MirroredStrategy), under tfrun.

    tfrun --devices 2 examples/mirrored_cnn.py

Changed from the tutorial: the data (MNIST -> scikit-learn digits resized to 28x28; `--data
mnist` keeps the real loader), the checkpoint path (the run's output directory), and the
epoch count is a flag. The model, strategy and callbacks are the tutorial's.
"""

import argparse
import os

import tensorflow as tf
from tensorflow.keras import layers, models

import tfrun
from _data import load

parser = argparse.ArgumentParser()
parser.add_argument("--data", default="digits", choices=["digits", "mnist"])
parser.add_argument("--epochs", type=int, default=10)
args = parser.parse_args()

# 1. Create strategy
strategy = tf.distribute.MirroredStrategy()
print(f"{type(strategy).__name__}: {strategy.num_replicas_in_sync} replicas")

# 2. Build model within strategy scope
with strategy.scope():
    model = models.Sequential([
        layers.Conv2D(32, (3, 3), activation='relu', input_shape=(28, 28, 1)),
        layers.MaxPooling2D((2, 2)),
        layers.Conv2D(64, (3, 3), activation='relu'),
        layers.MaxPooling2D((2, 2)),
        layers.Flatten(),
        layers.Dense(128, activation='relu'),
        layers.Dropout(0.5),
        layers.Dense(10, activation='softmax')
    ])
    model.compile(
        optimizer='adam',
        loss='sparse_categorical_crossentropy',
        metrics=['accuracy']
    )

# 3. Prepare data
(x_train, y_train), (x_test, y_test) = load(args.data, flat=False, size=28)

# 4. Create distributed dataset
batch_size_per_replica = 64
global_batch_size = batch_size_per_replica * strategy.num_replicas_in_sync
train_dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train))
train_dataset = train_dataset.shuffle(10000).batch(global_batch_size).prefetch(tf.data.AUTOTUNE)
test_dataset = tf.data.Dataset.from_tensor_slices((x_test, y_test))
test_dataset = test_dataset.batch(global_batch_size).prefetch(tf.data.AUTOTUNE)

# 5. Train model
history = model.fit(
    train_dataset,
    epochs=args.epochs,
    validation_data=test_dataset,
    callbacks=[
        tf.keras.callbacks.EarlyStopping(patience=3, restore_best_weights=True),
        tf.keras.callbacks.ModelCheckpoint(os.path.join(tfrun.output_dir(), 'best_model.h5'),
                                           save_best_only=True)
    ],
    verbose=2,
)

# 6. Evaluate model
test_loss, test_acc = model.evaluate(test_dataset, verbose=0)
print(f'Test Accuracy: {test_acc:.4f}')
