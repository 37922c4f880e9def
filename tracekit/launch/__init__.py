"""The `tracekit record` launcher's process: it creates the store, starts the command with the
zero-code bootstrap on its PYTHONPATH, waits for the ranks' writer processes and finalizes.
Never imports torch, nor tracekit.recorders (what runs inside a training rank)."""
