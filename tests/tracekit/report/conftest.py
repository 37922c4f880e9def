"""The HTML report of samples/inspect_divergence.py's runs (conftest's divergence_runs), written once
per test process for the tests that read it: test_html's (its sections; the stores it opened) and
test_browser's (the page a browser renders). Building it plots 7 figures: ~1.5 CPU-s a report."""

import os
from types import SimpleNamespace

import pytest


@pytest.fixture(scope="session")
def divergence_report(divergence_runs, tmp_path_factory):
    """write_report(ref, cand, folder / "report.html") of the divergence runs: .report (the
    DiffReport it returned), .path, .text (the file), .notes (what it told on_note), .opened (the
    absolute paths of every RunStore opened while it ran)."""
    pytest.importorskip("matplotlib")
    from tracekit.report import write_report
    from tracekit.store import reader

    opened, notes = [], []
    original = reader.RunStore.__init__

    def counting(self, path, *args, **kwargs):
        opened.append(os.path.abspath(os.fspath(path)))
        original(self, path, *args, **kwargs)

    path = tmp_path_factory.mktemp("divergence-report") / "report.html"
    with pytest.MonkeyPatch.context() as m:
        m.setattr(reader.RunStore, "__init__", counting)
        report = write_report(*divergence_runs, path, on_note=notes.append)
    return SimpleNamespace(report=report, path=path, text=path.read_text(), notes=notes, opened=opened)
