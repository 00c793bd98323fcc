"""What a task measures and sends its launcher: samples and progress, the step
breakdown, CPU contention, the checkpoint phase.
"""
