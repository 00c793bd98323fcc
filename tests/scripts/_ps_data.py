"""The small classification problem ps_fit.py and ps_backup.py train under parameter servers:

    tfrun.fit(model, dataset_fn, epochs=E, steps_per_epoch=N)
"""

import numpy as np
import tensorflow as tf

rng = np.random.default_rng(0)
x = rng.normal(size=(1024, 8)).astype("float32")
y = (x[:, :4].sum(axis=1) > x[:, 4:].sum(axis=1)).astype("int32")


def dataset_fn(ctx):
    """Each input pipeline's own shuffled, endless shard, batched per replica."""
    batch = ctx.get_per_replica_batch_size(32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1024, seed=ctx.input_pipeline_id)
    return ds.repeat().batch(batch).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
