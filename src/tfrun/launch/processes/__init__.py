"""The processes tfrun starts on this machine and how they end: cgroups, the
reaper, a process's end and its exit, OOM kills, forked and warm-started tasks, the
run's temporary directory, devices per task.
"""
