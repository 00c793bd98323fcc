"""tfrun's gradient exchange in a task: the hook into MultiWorkerMirroredStrategy,
shared memory on one host, TCP across hosts, both in two stages, and the arrival
records.
"""
