"""A graph error whose explanation follows the exception line (issue 12.7): a tf.function
reads past the end of its dataset.

    tfrun end_of_data.py
"""

import tensorflow as tf

iterator = iter(tf.data.Dataset.range(3))


@tf.function
def double_next(it):
    return next(it) * 2


for _ in range(5):
    print(int(double_next(iterator)), flush=True)
