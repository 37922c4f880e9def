"""Each recording rank's writer process and the spool it reads: the rank hands a step off
(handoff.py, spool.py) and the writer process (spool_writer.py) stores it, outliving the rank.
Never imports torch, nor tracekit.recorders."""
