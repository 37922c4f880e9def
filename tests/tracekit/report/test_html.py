"""The HTML report: self-contained, with the verdict, first divergence, loss table, heatmaps, worst tensors."""

import base64
import io
import os
import re
import subprocess
import sys
from html.parser import HTMLParser

import numpy as np
import pytest

from tracekit.report import write_report
from tracekit.store import RankWriter, TensorData, create_store


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.imgs, self.links, self.scripts_src, self.text = [], [], [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a)
        if tag in ("link", "iframe", "object", "embed"):
            self.links.append(a)
        if tag == "script" and "src" in a:
            self.scripts_src.append(a["src"])

    def handle_data(self, data):
        self.text.append(data)


def parse(text):
    p = _Page()
    p.feed(text)
    p.body = " ".join(" ".join(p.text).split())
    return p


def test_report_is_self_contained_with_all_sections(divergence_report):
    from PIL import Image

    # the page write_report wrote (tests/tracekit/report/conftest.py), which is build_report's text
    report, text, notes = divergence_report.report, divergence_report.text, divergence_report.notes
    assert notes == [] and report.status == "fail"
    page = parse(text)
    assert not page.links and not page.scripts_src
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", text)  # nothing fetched from the network
    alts = [i["alt"] for i in page.imgs]
    assert alts[0] == "loss curves of both runs"
    assert [a for a in alts if a.startswith("heatmap")] == [
        f"heatmap of the violation margin of {k} over rank and step" for k in ("outputs", "loss", "gradients", "parameters", "deltas")]
    assert alts[-1] == "worst tensors by violation margin"
    for i in page.imgs:
        prefix = "data:image/png;base64,"
        assert i["src"].startswith(prefix)
        im = Image.open(io.BytesIO(base64.b64decode(i["src"][len(prefix):])))
        im.load()
        assert im.format == "PNG" and im.size[0] > 300 and im.size[1] > 150
        assert len(np.unique(np.asarray(im.convert("L")))) > 10  # a picture, not a blank square
    body = page.body
    assert "FAIL comparison ranks=4 steps=5 violations=18 first_step=3" in body
    # first divergence: the planted fault, with its element and the two values
    fd = body[body.index("First divergence"):body.index("Loss")]
    for expected in ("step 3", "kind gradients", "tensor 0.weight", "rank (ref rank) 2 (2)", "element (5, 1)",
                     "relative error 0.5", "violating elements 1 of 128"):
        assert expected in fd, expected
    assert "ds.tracekit.locate('gradients/0.weight', step=3, rank=2)" in text.replace("&#x27;", "'")
    # the loss table has one row per step with both values
    loss = body[body.index("Loss"):body.index("Violation margin, rank x step")]
    for row in report.loss_table:
        assert f"{row.step} {row.ref:.9g} {row.cand:.9g}" in loss
    worst = body[body.index("Worst tensors"):body.index("Per step and kind")].split("rtol ", 1)[1].split()
    # the two tensors the planted half-sized element makes off by 50%, at rank 2, step 3
    table = [worst[i:i + 8] for i in range(0, len(worst) - 7, 8)]  # 8 columns a row, tensor first
    rows = {r[0]: (r[2], r[3], r[4]) for r in table if r[0] in ("deltas/0.weight", "gradients/0.weight")}
    assert len(rows) == 2 and all(float(r[1]) > 1 for r in table[:2])  # failing tensors, margin > 1, first
    for name, (rel_err, rank, step) in rows.items():
        # the relative error of the halved element is 0.5, up to rounding in the update p - lr * g
        assert (rank, step) == ("2", "3") and abs(float(rel_err) - 0.5) < 1e-3, (name, rel_err)


def test_pass_report_and_missing_matplotlib(divergence_runs, monkeypatch, tmp_path):
    from tracekit.report import plots

    def no_matplotlib(*a, **k):
        raise plots.PlottingUnavailable("matplotlib is not installed (pip install 'tracekit[plot]')")

    monkeypatch.setattr(plots, "_figure", no_matplotlib)
    out = tmp_path / "r.html"
    report = write_report(divergence_runs[0], divergence_runs[0], out)
    assert report.status == "pass"
    page = parse(out.read_text())
    assert page.imgs == []
    assert "No plots: matplotlib is not installed (pip install 'tracekit[plot]')." in page.body
    assert "PASS comparison ranks=4 steps=5" in page.body
    assert "None: every compared tensor is within tolerance." in page.body
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]  # no temporary left beside it


def test_structural_error_still_writes_a_report(tmp_path):
    paths = []
    for side, ranks in (("ref", 2), ("cand", 1)):
        path = str(tmp_path / side)
        create_store(path, {})
        for r in range(ranks):
            w = RankWriter(path, r, {"coords": {"rank": r}})
            w.write(1, "loss", [TensorData("loss", "float32", (), np.array(1.0, np.float32))])
            w.complete_step(1)
            w.close()
        paths.append(path)
    out = tmp_path / "r.html"
    report = write_report(*paths, out)
    assert report.status == "error"
    body = parse(out.read_text()).body
    assert "ERROR comparison" in body and "cand lacks rank 1" in body and "--allow-missing" in body


def test_report_opens_each_store_once(divergence_runs, divergence_report):
    # every RunStore opened while write_report ran (tests/tracekit/report/conftest.py counts them)
    assert sorted(divergence_report.opened) == sorted(os.path.abspath(p) for p in divergence_runs)


def test_report_needs_only_the_plot_extra(divergence_runs, tmp_path):
    # dask made unimportable, as in an environment with `pip install tracekit[plot]` only
    code = ("import sys; sys.modules['dask'] = sys.modules['dask.array'] = None\n"
            "from tracekit.report import write_report\n"
            "r = write_report(sys.argv[1], sys.argv[2], sys.argv[3]); print(r.summary_line)\n"
            "assert 'dask' not in [m.split('.')[0] for m, v in sys.modules.items() if v is not None]")
    out = subprocess.run([sys.executable, "-c", code, *divergence_runs, str(tmp_path / "r.html")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("FAIL comparison ranks=4 steps=5")
    assert "<img" in (tmp_path / "r.html").read_text()  # plots drawn


def _one_loss_stores(tmp_path) -> list[str]:
    paths = []
    for side in ("ref", "cand"):
        path = str(tmp_path / side)
        create_store(path, {})
        w = RankWriter(path, 0, {"coords": {"rank": 0}})
        w.write(1, "loss", [TensorData("loss", "float32", (), np.array(1.0, np.float32))])
        w.complete_step(1)
        w.close()
        paths.append(path)
    return paths


def test_a_report_written_to_a_fifo_goes_into_it_and_the_fifo_stays(tmp_path):
    import stat
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader is there before the report opens it
    got, written = [], threading.Event()

    def read_all():
        import select

        while True:
            if select.select([fd], [], [], 0.5)[0]:
                chunk = os.read(fd, 1 << 16)
                if not chunk:  # the report closed the pipe
                    return
                got.append(chunk)
            elif written.is_set():  # write_report returned and the pipe holds nothing: it never opened it
                return

    ref, cand = _one_loss_stores(tmp_path)
    reader = threading.Thread(target=read_all)
    reader.start()
    try:
        write_report(ref, cand, fifo)
    finally:
        written.set()
        reader.join(60)
        os.close(fd)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # a rename would have put a file in its place
    assert "PASS comparison ranks=1 steps=1" in b"".join(got).decode()


def test_a_report_written_to_a_link_fills_its_target_and_the_link_stays(tmp_path):
    ref, cand = _one_loss_stores(tmp_path)
    target = tmp_path / "kept" / "report.html"
    target.parent.mkdir()
    target.write_text("an older report")
    link = tmp_path / "latest.html"
    link.symlink_to(target)
    write_report(ref, cand, link)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert "PASS comparison ranks=1 steps=1" in target.read_text()


def test_a_report_that_cannot_be_written_leaves_the_old_one_and_no_temporary(tmp_path, full_disk):
    from tracekit.errors import UsageError

    ref, cand = _one_loss_stores(tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "r.html"
    out.write_text("the old report")
    with full_disk(), pytest.raises(UsageError, match="cannot write it .No space left on device"):
        write_report(ref, cand, out)
    assert out.read_text() == "the old report"
    assert [p.name for p in out_dir.iterdir()] == ["r.html"]
