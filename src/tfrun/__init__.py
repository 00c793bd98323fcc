"""tfrun: launch and run distributed TensorFlow/Keras training with one command.

The launcher side (``tfrun.cluster``, the CLI) never imports TensorFlow. The runtime
helpers used inside a training script are filled in by later modules.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
