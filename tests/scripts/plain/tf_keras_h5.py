"""tf_keras (tfrun --keras 2) under MirroredStrategy: save and load a .weights.h5 file
(issue 12.5, keras-team/tf-keras#731).

    tfrun --keras 2 --devices 2 tf_keras_h5.py WEIGHTS_PATH
"""

import sys

import numpy as np
import tensorflow as tf

import keras  # tf_keras under tfrun --keras 2

path = sys.argv[1]
strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = keras.Sequential([keras.layers.Dense(4, input_shape=(3,)), keras.layers.Dense(1)])
    model.compile(loss="mse", optimizer="sgd", metrics=["mae"])
    model.fit(np.ones((16, 3)), np.ones((16, 1)), epochs=1, verbose=0)
    model.save_weights(path)
    trained = [w.copy() for w in model.get_weights()]
    model.set_weights([np.zeros_like(w) for w in trained])
    model.load_weights(path)
same = all(np.array_equal(a, b) for a, b in zip(model.get_weights(), trained))
print(f"tf_keras_h5: keras {keras.__version__}, {strategy.num_replicas_in_sync} replicas, "
      f"weights restored: {same}", flush=True)
