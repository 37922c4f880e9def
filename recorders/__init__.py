"""Hooks that capture a training loop's tensors into a tracekit store (shipped as tracekit.recorders).

Names are imported on first use: `tracekit record` (the launcher) needs the configuration, not the
recorder, and must not import torch for it.
"""

_LAZY = {"RecordConfig": "tracekit.launch.config", "Recorder": "tracekit.recorders.recorder"}

__all__ = ["RecordConfig", "Recorder"]


from tracekit._lazy import lazy_names  # noqa: E402

__getattr__, __dir__ = lazy_names('tracekit.recorders', _LAZY, globals())
