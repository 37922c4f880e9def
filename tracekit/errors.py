"""Errors that reach users as one readable line (the CLI prints str(error) and exits non-zero)."""


class TracekitError(Exception):
    """Base class of every error tracekit raises on purpose."""


class StoreError(TracekitError):
    """A path is not a usable tracekit store: foreign, half-written, too new, or unreadable."""


class UsageError(TracekitError):
    """The caller asked for something inconsistent (bad option values, conflicting settings)."""
