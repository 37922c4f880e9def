"""Hooks that capture a training loop's tensors into a tracekit store (shipped as tracekit.recorders).

Names load lazily: the writer process (tracekit.recorders.spool_writer) lives in this package and
must start without importing torch.
"""

__all__ = ["RecordConfig", "Recorder"]


def __getattr__(name):
    if name == "RecordConfig":
        from tracekit.recorders.config import RecordConfig

        return RecordConfig
    if name == "Recorder":
        from tracekit.recorders.recorder import Recorder

        return Recorder
    raise AttributeError(f"module 'tracekit.recorders' has no attribute {name!r}")
