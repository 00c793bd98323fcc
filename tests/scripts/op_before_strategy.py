"""A common mistake: a TensorFlow operation before the multi-worker strategy is made.

TensorFlow then refuses to make it ("Collective ops must be configured at program
startup"); tfrun's failure summary explains the fix.
"""

import tensorflow as tf

import tfrun

tf.constant(1.0) + 1.0  # any op initialises TensorFlow's context (seeding, a dataset, ...)
strategy = tfrun.strategy()
print("never reached:", strategy)
