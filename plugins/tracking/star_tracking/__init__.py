"""star-engine-tracking: writes a run's metrics as TensorBoard event files under
``<run_dir>/tensorboard/`` (with the optional ``tensorboardX``), and its state
to ``<run_dir>/tracking.json``."""

from .tracker import LOGDIR, STATE_FILE, writer_class

__all__ = ["LOGDIR", "STATE_FILE", "writer_class"]
