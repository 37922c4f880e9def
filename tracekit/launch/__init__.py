"""The `tracekit record` launcher's process: it creates the store, starts the command with the
zero-code bootstrap on its PYTHONPATH, waits for the ranks' writer processes and finalizes.
Never imports torch, nor tracekit.recorders (what runs inside a training rank); the bootstrap
(bootstrap/sitecustomize.py) is a file the ranks run, not a module of this process.

What `tracekit record` needs, imported on first use: the ranks import tracekit.launch.config
alone and must not pay for the launcher.
"""

_CONFIG = "tracekit.launch.config"
_LAZY = {**{name: _CONFIG for name in ("RecordConfig", "RECORDABLE_KINDS", "DEFAULT_FLUSH_TIMEOUT", "DEFAULT_QUEUE_MB",
                                       "DEFAULT_WRITER_NICE", "MAX_NICE", "parse_kinds", "parse_ranks", "parse_seconds",
                                       "parse_step_range")},
         "record_job": "tracekit.launch.launcher",
         "untraced_problem": "tracekit.launch.trace_check", "traced_line": "tracekit.launch.trace_check"}

__all__ = sorted(_LAZY)


from tracekit._lazy import lazy_names  # noqa: E402

__getattr__, __dir__ = lazy_names("tracekit.launch", _LAZY, globals())
