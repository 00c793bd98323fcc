"""Counts the page faults of MatMuls after a tf.distribute dataset has been read (tfrun.in_task.start.heap).

    tfrun --workers 1 heap_probe.py            # tfrun's default --mmap-threshold
    tfrun --workers 1 --mmap-threshold tf heap_probe.py

Reading a distributed dataset builds TensorFlow's first GeneratorDataset kernel, which pins
glibc's mmap threshold at 128 KiB; oneDNN's MatMul packing buffers (over 1 MiB here) are
then a fresh mmap each call unless tfrun set the threshold back.
"""

import ctypes
import json
import resource

import numpy as np
import tensorflow as tf

strategy = tf.distribute.MirroredStrategy(["/cpu:0"])  # what Keras fit reads data through
data = tf.data.Dataset.from_tensor_slices(tf.ones((64, 8))).batch(8).repeat()
next(iter(strategy.experimental_distribute_dataset(data)))  # TensorFlow pins it here

a, b = tf.random.normal((1024, 1024)), tf.random.normal((1024, 1024))


@tf.function
def matmuls():
    return tf.reduce_sum(tf.matmul(a, b)) + tf.reduce_sum(tf.matmul(a, b, transpose_b=True))


for _ in range(10):  # trace, and let the heap grow to what a call needs
    matmuls().numpy()
calls = 40
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(calls):
    matmuls().numpy()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def faults_per_buffer(calls=40):
    """A 4 MiB buffer made and freed, like the per-step arrays of an all-reduce: with
    TensorFlow's 128 KiB trim threshold, freeing it hands it back and it faults in again."""
    np.ones(1 << 20, np.float32).sum()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        np.ones(1 << 20, np.float32).sum()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls


class _MallocInfo(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


def buffer_is_a_fresh_mmap():
    """Whether glibc serves a 4 MiB buffer by mmap (its count of mmapped chunks grows while
    the buffer lives). Unlike page faults, this does not depend on the kernel's transparent
    huge pages: with THP 'always' a fresh 4 MiB mapping faults in as two huge pages."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallocInfo
    before = libc.mallinfo2().hblks
    held = np.ones(1 << 20, np.float32)
    grown = libc.mallinfo2().hblks - before
    del held
    return grown > 0


print("heap_probe: " + json.dumps({"faults_per_call": faults / calls,
                                   "faults_per_buffer": faults_per_buffer(),
                                   "buffer_is_a_fresh_mmap": buffer_is_a_fresh_mmap()}),
      flush=True)
