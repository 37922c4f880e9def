

from tracekit import open_store


def test_interpreter_exit_without_close_flushes_every_step(tmp_path):
    import subprocess
    import sys

    script = (
        "import sys, torch\n"
        "from tracekit.recorders import Recorder\n"
        "m = torch.nn.Linear(512, 512); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "rec = Recorder(m, opt, store=sys.argv[1]).start()\n"
        "for s in range(20):\n"
        "    out = m(torch.ones(3, 512)); l = out.sum(); l.backward()\n"
        "    rec.observe(output=out, loss=l); opt.step(); opt.zero_grad()\n"
    )  # never closes: the exit hooks must drain the queue before zarr's executors shut down
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "s")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    rank = open_store(tmp_path / "s").rank(0)
    assert rank.completed_steps == list(range(1, 21))
    assert rank.status == "finished"
