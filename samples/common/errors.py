"""The one error type the workloads raise on purpose (kept apart from tracekit's own errors)."""


class WorkloadError(Exception):
    """A run cannot go on: a bad launch, a bad flag combination, or a training check that failed.

    train.py prints the message as one line and exits non-zero; torchrun then stops the other ranks.
    """
