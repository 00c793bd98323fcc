"""Keras callback the benchmark tasks share: wall time of each epoch."""

import time

import keras


class EpochTimer(keras.callbacks.Callback):
    """``times``: seconds per epoch, in order (time the first apart: it traces and builds)."""

    def __init__(self):
        super().__init__()
        self.times = []

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.times.append(time.perf_counter() - self.start)
