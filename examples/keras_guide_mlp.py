"""The Keras guide "Multi-GPU and distributed training" (keras.io), as written, under tfrun.

    tfrun --devices 2 examples/keras_guide_mlp.py      # MirroredStrategy over 2 CPUs

Changed from the tutorial: only the data (MNIST -> scikit-learn digits, which ship with the
package; `--data mnist` keeps the real loader) and the checkpoint directory (under the
run directory instead of ./ckpt). The strategy code is the guide's own.
"""

import argparse
import os

import tensorflow as tf

import keras
from _data import load

parser = argparse.ArgumentParser()
parser.add_argument("--data", default="digits", choices=["digits", "mnist"])
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()


def get_compiled_model():
    # Make a simple 2-layer densely-connected neural network.
    inputs = keras.Input(shape=(64 if args.data == "digits" else 784,))
    x = keras.layers.Dense(256, activation="relu")(inputs)
    x = keras.layers.Dense(256, activation="relu")(x)
    outputs = keras.layers.Dense(10)(x)
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )
    return model


def get_dataset():
    batch_size = 32
    num_val_samples = 300 if args.data == "digits" else 10000
    (x_train, y_train), (x_test, y_test) = load(args.data)
    # Reserve num_val_samples samples for validation
    x_val = x_train[-num_val_samples:]
    y_val = y_train[-num_val_samples:]
    x_train = x_train[:-num_val_samples]
    y_train = y_train[:-num_val_samples]
    return (
        tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(batch_size),
        tf.data.Dataset.from_tensor_slices((x_val, y_val)).batch(batch_size),
        tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(batch_size),
    )


# Create a MirroredStrategy.
strategy = tf.distribute.MirroredStrategy()
print("Number of devices: {}".format(strategy.num_replicas_in_sync))
print(f"{type(strategy).__name__}: {strategy.num_replicas_in_sync} replicas")

# Open a strategy scope.
with strategy.scope():
    # Everything that creates variables should be under the strategy scope.
    # In general this is only model construction & `compile()`.
    model = get_compiled_model()

# Train the model on all available devices.
train_dataset, val_dataset, test_dataset = get_dataset()
model.fit(train_dataset, epochs=args.epochs, validation_data=val_dataset, verbose=2)

# Test the model on all available devices.
print("test [loss, accuracy]:", model.evaluate(test_dataset, verbose=0))

# --- Using callbacks to ensure fault tolerance (the guide's second program) ---------------
checkpoint_dir = os.path.join(os.environ.get("TFRUN_RUN_DIR", "."), "ckpt")
if not os.path.exists(checkpoint_dir):
    os.makedirs(checkpoint_dir)


def make_or_restore_model():
    # Either restore the latest model, or create a fresh one
    # if there is no checkpoint available.
    checkpoints = [checkpoint_dir + "/" + name for name in os.listdir(checkpoint_dir)]
    if checkpoints:
        latest_checkpoint = max(checkpoints, key=os.path.getctime)
        print("Restoring from", latest_checkpoint)
        return keras.models.load_model(latest_checkpoint)
    print("Creating a new model")
    return get_compiled_model()


def run_training(epochs=1):
    # Create a MirroredStrategy.
    strategy = tf.distribute.MirroredStrategy()

    # Open a strategy scope and create/restore the model
    with strategy.scope():
        model = make_or_restore_model()

        callbacks = [
            # This callback saves a SavedModel every epoch
            # We include the current epoch in the folder name.
            keras.callbacks.ModelCheckpoint(
                filepath=checkpoint_dir + "/ckpt-{epoch}.keras",
                save_freq="epoch",
            )
        ]
        model.fit(
            train_dataset,
            epochs=epochs,
            callbacks=callbacks,
            validation_data=val_dataset,
            verbose=2,
        )


# Running the first time creates the model
run_training(epochs=1)

# Calling the same function again will resume from where we left off
run_training(epochs=1)
