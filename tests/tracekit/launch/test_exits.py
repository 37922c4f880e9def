"""The launcher's reading of torchrun's failure report, and the final status it gives a rank."""

from tracekit.launch.exits import worker_exits
from tracekit.store.status import final_rank_status

# torchrun 2.x's report when rank 1 was SIGKILLed and torchrun then stopped rank 0 (trimmed)
REPORT = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
======================================================
train.py FAILED
------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-30_14:20:06
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 7697)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 7697
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_14:20:06
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 3 (pid: 7698)
  error_file: <N/A>
======================================================
"""


def test_worker_exits_reads_every_reported_rank():
    assert worker_exits(REPORT) == {0: -15, 1: 3}
    assert worker_exits("no report here\n") == {}


def test_final_status():
    assert final_rank_status("running", None, -9) == ("killed", "killed by SIGKILL")
    assert final_rank_status("running", None, 3) == ("died", "exit status 3 without closing its recording")
    assert final_rank_status("running", None, None)[0] == "died"
    assert final_rank_status("failed", "RuntimeError: x", 1) == ("failed", "RuntimeError: x")
    assert final_rank_status("terminated", None, -15) == ("terminated", "killed by SIGTERM")
    assert final_rank_status("finished", None, -15) == ("finished", None)  # stopped after its loop ended
    assert final_rank_status("finished", None, 1) == ("failed", "exit status 1 after its recording closed")
