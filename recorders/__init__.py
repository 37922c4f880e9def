"""Hooks that capture a training loop's tensors into a tracekit store (shipped as tracekit.recorders).

Names are imported on first use: `tracekit record` (the launcher) needs the configuration, not the
recorder, and must not import torch for it.
"""

if __name__ != "tracekit.recorders":  # the checkout's folder imported as itself: a second copy of every module
    raise ImportError(f"{__name__!r} is tracekit's recorders/ folder imported by its path; it ships as "
                      "tracekit.recorders: import tracekit.recorders (pip install -e . from a checkout)")

_LAZY = {"RecordConfig": "tracekit.launch.config", "Recorder": "tracekit.recorders.recorder"}

__all__ = ["RecordConfig", "Recorder"]


from tracekit._lazy import lazy_names  # noqa: E402

__getattr__, __dir__ = lazy_names('tracekit.recorders', _LAZY, globals())
