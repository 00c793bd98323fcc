"""The evaluator sidecar (the "evaluator" role of the Keras distributed-training guide): evaluate every checkpoint the chief
writes, while training runs, and the last one after it ends.

On the evaluator task (``tfrun --evaluator``)::

    model = build_and_compile()                      # same architecture, no strategy needed
    for result in tfrun.sidecar_evaluate(model, test_ds, tfrun.chief_output_dir("checkpoints")):
        print(result)                                # {"checkpoint": ..., "loss": ..., ...}

It returns when tfrun says training is done (``tfrun.training_done()``) and every checkpoint
present then has been evaluated; tfrun gives it ``--evaluator-grace`` seconds for that.
Results are also appended to ``contract.RUN_DIR/evaluator/results.jsonl``.
"""

from __future__ import annotations

import glob
import json
import os
import time
from typing import Iterator

from .. import contract
from .runtime import chief_output_dir, training_done

__all__ = ["chief_output_dir", "sidecar_evaluate"]


def sidecar_evaluate(model, dataset, checkpoint_dir: str, *, pattern: str = "*.weights.h5",
                     poll_seconds: float = 1.0, steps: int | None = None) -> Iterator[dict]:
    """Evaluate every new checkpoint in ``checkpoint_dir``, oldest first, until training
    is done: a generator that yields ``{"checkpoint": name, metric: value, ...}`` per
    checkpoint (iterate it: a bare call evaluates nothing).

    Only files matching ``pattern`` count (default ``*.weights.h5``: what
    ``keras.callbacks.ModelCheckpoint(..., save_weights_only=True)`` writes as
    ``ckpt-{epoch}.weights.h5``); a file still being written is retried at the next poll,
    every ``poll_seconds``. ``steps`` limits each evaluation. Under tfrun each result is
    also appended to ``<run dir>/evaluator/results.jsonl``. For the evaluator task
    (``tfrun --evaluator``):

        for result in tfrun.sidecar_evaluate(model, val_ds, tfrun.chief_output_dir("ckpt")):
            print(result)
    """
    seen: set[str] = set()
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        # Checkpoints carry the optimizer's slots; an unbuilt optimizer would skip them noisily.
        optimizer.build(model.trainable_variables)
    results_path = None
    if os.environ.get(contract.RUN_DIR):
        os.makedirs(os.path.join(os.environ[contract.RUN_DIR], "evaluator"), exist_ok=True)
        results_path = os.path.join(os.environ[contract.RUN_DIR], "evaluator", "results.jsonl")
    while True:
        # Read "done" *before* listing: a checkpoint written just before the end is listed.
        done = training_done()
        pending = sorted((p for p in glob.glob(os.path.join(checkpoint_dir, pattern)) if p not in seen),
                         key=os.path.getmtime)
        for path in pending:
            try:
                model.load_weights(path)
            except (OSError, ValueError):
                break  # still being written: retry at the next poll
            seen.add(path)
            values = model.evaluate(dataset, steps=steps, verbose=0, return_dict=True)
            result = {"checkpoint": os.path.basename(path), **{k: float(v) for k, v in values.items()}}
            if results_path:
                with open(results_path, "a") as f:
                    f.write(json.dumps(result) + "\n")
            yield result
        else:
            if done:
                return
        time.sleep(poll_seconds)
