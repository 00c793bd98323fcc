"""A task's start: the bootstrap that runs the script, the set-up before it (hooks,
isolation, a pod's TF_CONFIG, the heap), and the forked and warm starters.
"""
