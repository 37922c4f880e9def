"""Hooks that capture a training loop's tensors into a tracekit store (shipped as tracekit.recorders).

Names are imported on first use: `tracekit record` (the launcher) needs the configuration, not the
recorder, and must not import torch for it.
"""

_LAZY = {"RecordConfig": "tracekit.recorders.config", "Recorder": "tracekit.recorders.recorder"}

__all__ = ["RecordConfig", "Recorder"]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tracekit.recorders' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
