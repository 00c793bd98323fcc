"""``tfrun bench --model mlp|cnn``: a synthetic model to benchmark when no script is given.

    tfrun --workers 2 -m tfrun.in_task._bench_model --model mlp --steps 40 --epochs 3

``mlp`` is the scaling tutorial's MLP (784-1024-1024-10, 256 samples per replica per step); ``cnn`` a
small convnet on 28x28x1 images (64 per replica). The data is random (no download): the
point is the time a step takes, not what the model learns. Under ``tfrun.strategy()``;
the global batch is ``tfrun.global_batch_size`` (weak scaling; ``tfrun bench --strong``
keeps it fixed). tfrun records the throughput; this script prints nothing of its own.
"""

from __future__ import annotations

import argparse

_PER_REPLICA = {"mlp": 256, "cnn": 64}


def _model(kind: str):
    import keras

    if kind == "mlp":
        return keras.Sequential([keras.Input((784,)), keras.layers.Dense(1024, activation="relu"),
                                 keras.layers.Dense(1024, activation="relu"),
                                 keras.layers.Dense(10)])
    return keras.Sequential([
        keras.Input((28, 28, 1)), keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Conv2D(64, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10)])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="tfrun.in_task._bench_model")
    parser.add_argument("--model", choices=sorted(_PER_REPLICA), default="mlp")
    parser.add_argument("--steps", type=int, default=40, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-per-replica", type=int, default=None)
    args = parser.parse_args(argv)

    import keras
    import numpy as np
    import tensorflow as tf

    import tfrun

    strategy = tfrun.strategy()
    batch = tfrun.global_batch_size(args.batch_per_replica or _PER_REPLICA[args.model])
    shape = (784,) if args.model == "mlp" else (28, 28, 1)
    rng = np.random.default_rng(tfrun.task().index)
    # A few batches, repeated: generating data must not be what is measured.
    x = rng.normal(size=(4 * batch, *shape)).astype("float32")
    y = rng.integers(0, 10, size=len(x)).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)
    data = data.repeat().prefetch(tf.data.AUTOTUNE)
    with strategy.scope():
        model = _model(args.model)
        model.compile(optimizer="sgd",
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(data, epochs=args.epochs, steps_per_epoch=args.steps, verbose=0)


if __name__ == "__main__":
    main()
