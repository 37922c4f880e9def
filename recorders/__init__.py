"""Hooks that capture a training loop's tensors into a tracekit store (shipped as tracekit.recorders)."""

from tracekit.recorders.config import RecordConfig
from tracekit.recorders.recorder import Recorder

__all__ = ["RecordConfig", "Recorder"]
