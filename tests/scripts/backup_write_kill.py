"""A 50.3M-parameter model's backups through tfrun's BackupStore, in one process (no cluster):
the test kills it in the middle of a background write, then loads what is on disk.

    python backup_write_kill.py write DIR   # backup step-1 (waited for), then step-2 in the
                                            # background; prints "writing" and sleeps
    python backup_write_kill.py load DIR    # lists the complete backups, removes what a cut
                                            # write left, loads the newest (checked)

Input(4096) and three Dense(4096), Adam built: 151M values, 604 MB a backup. The weights of
step-1 are all 0.25, those of step-2 all 0.75: ``load`` prints which it got.
"""

import sys
import time

import keras
import numpy as np

from tfrun.in_task.backup.store import BackupStore

mode, directory = sys.argv[1], sys.argv[2]
model = keras.Sequential([keras.Input((4096,))] + [keras.layers.Dense(4096) for _ in range(3)])
model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
model.optimizer.build(model.trainable_variables)
store = BackupStore(directory)


def set_all(value: float) -> None:
    for variable in model.trainable_variables:
        variable.assign(np.full(variable.shape, value, "float32"))


if mode == "write":
    print(f"parameters {model.count_params()}", flush=True)
    set_all(0.25)
    store.write(model, "step-1", {"epoch": 0, "batch": 1, "step": 0, "input": None,
                                  "replicas": 1})
    assert store.wait()
    set_all(0.75)
    store.write(model, "step-2", {"epoch": 0, "batch": 2, "step": 0, "input": None,
                                  "replicas": 1})
    print("writing", flush=True)
    time.sleep(600)
else:
    saves = store.saves()
    print("complete", " ".join(s["name"] for s in saves), flush=True)
    store.remove_temporaries()
    store.load(model, saves[-1])
    print("loaded", saves[-1]["name"], "weights",
          sorted({float(v.numpy().flat[0]) for v in model.trainable_variables}), flush=True)
