"""The small fixed problem backup_kill.py, resume.py and plain/stock_backup.py train: same
data and initial weights on every task, so runs can be compared weight for weight.

    x, y = small_data(128)
    model = small_model(tfrun.strategy(), lambda: keras.optimizers.SGD(0.1))
"""

import numpy as np

import keras


def small_data(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 6)).astype("float32")
    y = rng.integers(0, 2, size=n).astype("int32")
    return x, y


def small_model(strategy, make_optimizer) -> keras.Model:
    """Dense 6 -> 8 -> 2 with fixed initial weights, compiled under ``strategy`` (the
    optimizer too: ``make_optimizer`` is called inside its scope)."""
    init = [np.random.default_rng(1).normal(scale=0.3, size=s).astype("float32")
            for s in [(6, 8), (8,), (8, 2), (2,)]]
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(2)])
        model.set_weights(init)
        model.compile(optimizer=make_optimizer(),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model
