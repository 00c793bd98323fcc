"""What a run leaves: its directory, its statistics, the report, TensorBoard,
and the secrets kept out of them.
"""
