"""The report's pictures and notebook helpers agree with open_diff, cell by cell and bar by bar."""

import html
import io
import re

import numpy as np
import pytest

import tracekit
from tracekit.errors import UsageError
from tracekit.store import RankWriter, TensorData, create_store, finalize_store

pytest.importorskip("matplotlib")
f32 = np.float32


def _write(path, cand: bool):
    """2 ranks, steps 1-5: gradients w (4x4), deltas d (4), loss. The candidate has
    - step 3 rank 1: deltas d[0] is 0 in the reference and 0.5 in the candidate (max_rel_err inf, finite error);
    - step 4 rank 0: gradients w[1, 1] is NaN (a non-finite mismatch);
    - step 5 rank 0: deltas d[1] 1e-9 -> 3e-9 (relative error 2, inside atol: passes).
    Rank 1 records no gradients at step 5 (in both runs): not compared."""
    create_store(path, {"launcher": "test"})
    for r in range(2):
        w = RankWriter(path, r, {"coords": {"rank": r, "world_size": 2}})
        for s in range(1, 6):
            rng = np.random.default_rng([r, s])
            g = rng.standard_normal((4, 4)).astype(f32)
            d = (rng.standard_normal(4) * 0.01).astype(f32)
            if (r, s) == (1, 3):
                d[0] = 0.5 if cand else 0.0
            if (r, s) == (0, 4) and cand:
                g[1, 1] = np.nan
            if (r, s) == (0, 5):
                d[1] = f32(3e-9) if cand else f32(1e-9)
            w.write(s, "loss", [TensorData("loss", "float32", (), np.array(1.0 / s, f32))])
            if not (r == 1 and s == 5):
                w.write(s, "gradients", [TensorData("w", "float32", (4, 4), g)])
            w.write(s, "deltas", [TensorData("d", "float32", (4,), d)])
            w.complete_step(s)
        w.close()
    finalize_store(path, 0)
    return str(path)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("truth")
    return _write(tmp / "ref", False), _write(tmp / "cand", True)


@pytest.fixture(scope="module")
def ds(pair):
    return tracekit.open_diff(*pair)


def _lum(rgba):
    return 0.2126 * rgba[..., 0] + 0.7152 * rgba[..., 1] + 0.0722 * rgba[..., 2]


def test_heatmap_cells_match_open_diff(ds):
    from matplotlib.colors import to_rgba

    from tracekit.report import cells, plots

    grey, magenta = np.array(to_rgba(plots.GREY)), np.array(to_rgba(plots.NONFINITE_COLOR))
    maps = {hm.kind: hm for hm in cells.heatmaps(ds)}
    assert set(maps) == {"loss", "gradients", "deltas"}
    for kind, hm in maps.items():
        rgba = plots.heatmap_rgba(hm)
        failing_lum, passing_lum = [], []
        for i, rank in enumerate(hm.ranks):
            for j, step in enumerate(hm.steps):
                sub = ds.sel(rank=rank, step=step).where(ds["kind"] == kind, drop=True)
                compared = bool(sub["compared"].any())
                failed = bool((sub["compared"].astype(bool) & ~sub["passed"].astype(bool)).any())  # either rule
                nonfinite = bool((sub["nonfinite"].fillna(0) > 0).any())
                cell = rgba[i, j]
                assert np.allclose(cell, grey) == (not compared), (kind, rank, step)
                assert np.allclose(cell, magenta) == nonfinite, (kind, rank, step)
                if compared and not nonfinite:
                    (failing_lum if failed else passing_lum).append(float(_lum(cell)))
                    assert (hm.margin[i, j] > 1) == failed, (kind, rank, step, hm.margin[i, j])
        if failing_lum and passing_lum:  # the failure outshines every passing cell
            assert min(failing_lum) > max(passing_lum), kind


def test_the_issues_cells(ds):
    """The infinite relative error is compared and failing (not grey); the near-zero element passes, dim."""
    from tracekit.report import cells, plots

    deltas = next(hm for hm in cells.heatmaps(ds) if hm.kind == "deltas")
    step = list(deltas.steps)
    assert np.isinf(float(ds["max_rel_err"].sel(rank=1, step=3, tensor="deltas/d")))
    assert deltas.state[1, step.index(3)] == cells.FAIL and np.isfinite(deltas.margin[1, step.index(3)])
    assert float(ds["max_rel_err"].sel(rank=0, step=5, tensor="deltas/d")) > 1  # huge relative error ...
    assert deltas.state[0, step.index(5)] == cells.PASS and deltas.margin[0, step.index(5)] <= 1  # ... yet a pass
    rgba = plots.heatmap_rgba(deltas)
    assert _lum(rgba[1, step.index(3)]) > _lum(rgba[0, step.index(5)])
    grads = next(hm for hm in cells.heatmaps(ds) if hm.kind == "gradients")
    assert grads.state[0, list(grads.steps).index(4)] == cells.NONFINITE
    assert grads.state[1, list(grads.steps).index(5)] == cells.NOT_COMPARED


def test_worst_tensor_bars_match_open_diff(ds):
    from tracekit.report import cells, plots

    items = cells.worst_tensors(ds)
    failing = {str(t) for t in ds["tensor"].values
               if bool((ds["compared"] & ~ds["passed"]).sel(tensor=t).any())}
    assert failing == {"gradients/w", "deltas/d"}
    assert [w.tensor for w in items[:len(failing)]] == ["gradients/w", "deltas/d"]  # non-finite first
    assert {w.tensor for w in items} == {str(t) for t in ds["tensor"].values}
    lengths = plots.bar_lengths([w.margin for w in items])
    assert np.isfinite(lengths).all() and (lengths > 0).all()  # every tensor has a bar, infinite ones too
    fail_len = [length for w, length in zip(items, lengths) if w.failing_pairs]
    pass_len = [length for w, length in zip(items, lengths) if not w.failing_pairs]
    assert min(fail_len) > max(pass_len)  # no passing tensor outgrows a failing one
    assert np.isinf(items[0].margin) and lengths[0] == lengths.max()


def test_pictures_draw_non_finite_errors(ds):
    from matplotlib.colors import to_rgb
    from PIL import Image

    from tracekit.report import cells, plots

    want = np.round(np.array(to_rgb(plots.NONFINITE_COLOR)) * 255)
    grads = next(hm for hm in cells.heatmaps(ds) if hm.kind == "gradients")
    pixels = np.asarray(Image.open(io.BytesIO(plots.error_heatmap(grads))).convert("RGB")).reshape(-1, 3)
    assert (np.abs(pixels - want).max(axis=1) <= 2).sum() > 100  # a magenta cell, not a grey one


@pytest.mark.parametrize("kinds", [["loss"], None], ids=["loss first", "gradients first"])
def test_notebook_snippet_runs_for_every_kind(tmp_path, kinds):
    ref, cand = _write(tmp_path / "ref", False), _write(tmp_path / "cand", True)
    if kinds == ["loss"]:  # a loss-scale fault from step 2: only the loss differs
        ref, cand = (_loss_store(tmp_path / n, v) for n, v in (("lref", 1.0), ("lcand", 2.0)))
    from tracekit.report import build_report

    report, text, _ = build_report(ref, cand)
    snippet = html.unescape(re.search(r"<p>The same in a notebook:</p><pre>(.*?)</pre>", text, re.S).group(1))
    scope: dict = {}
    for line in snippet.splitlines():
        exec(line, scope)  # noqa: S102 - the snippet a user pastes, line by line
    located = eval(snippet.splitlines()[-1].split("#")[0], scope)  # noqa: S307
    fd = report.first_divergence
    assert located["index"] == tuple(fd.worst.index) and (located["cand"] == fd.worst.cand or np.isnan(fd.worst.cand))


def _loss_store(path, scale):
    create_store(path, {"launcher": "test"})
    w = RankWriter(path, 0, {"coords": {"rank": 0, "world_size": 1}})
    for s in (1, 2, 3):
        w.write(s, "loss", [TensorData("loss", "float32", (), np.array(scale * s if s >= 2 else s, f32))])
        w.complete_step(s)
    w.close()
    finalize_store(path, 0)
    return str(path)


def test_reprs_are_short(pair):
    report = tracekit.diff(*pair, details="all")
    text = repr(report)
    assert len(text) < 400 and report.summary_line in text and "first divergence: step 3" in text
    page = report._repr_html_()
    assert len(page) < 4000 and "FAIL" in page and page.count("<li>") <= 6


def test_accessor_errors_are_one_line_usage_errors(ds):
    with pytest.raises(UsageError, match=r"^no step 99 in this diff \(steps: 1-5\)$"):
        ds.tracekit.locate("deltas/d", step=99, rank=0)
    with pytest.raises(UsageError, match=r"^no rank 7 in this diff"):
        ds.tracekit.locate("d", step=3, rank=7)
    with pytest.raises(UsageError, match="no tensor 'nope'"):
        ds.tracekit.locate("nope", step=3, rank=0)
    assert ds.tracekit.locate("d", step=3, rank=1)["index"] == (0,)
