"""bench/bench_read_path.py: each tree is imported through its own import root (its package-dir
mapping as links), never through the venv's editable install of this checkout."""

import os

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(BENCH)  # the benches import their siblings by bare name
    import bench_read_path

    return bench_read_path


def _tree(path, mapping=True):
    """A minimal tree: tracekit's store and compare, and cli/ shipped as tracekit.cli."""
    for f in ("tracekit/__init__.py", "tracekit/store/__init__.py", "tracekit/compare/__init__.py",
              "cli/__init__.py", "cli/main.py"):
        (path / f).parent.mkdir(parents=True, exist_ok=True)
        (path / f).write_text("")
    dirs = '[tool.setuptools.package-dir]\n"tracekit" = "tracekit"\n"tracekit.cli" = "cli"\n' if mapping else ""
    (path / "pyproject.toml").write_text(dirs)
    return str(path)


def test_the_import_root_loads_the_trees_own_modules_cli_included(bench, tmp_path):
    tree = _tree(tmp_path / "tree")
    root = bench.import_root(tree, str(tmp_path / "root"))
    bench.check_imports(tree, root, str(tmp_path))  # tracekit.cli from the tree's cli/, not this checkout's


def test_a_tree_whose_cli_the_root_misses_is_refused(bench, tmp_path):
    tree = _tree(tmp_path / "tree", mapping=False)  # no package-dir: tracekit.cli would come from elsewhere
    root = bench.import_root(tree, str(tmp_path / "root"))
    with pytest.raises(SystemExit, match="does not import"):
        bench.check_imports(tree, root, str(tmp_path))


def test_ratios_print_their_median_and_range(bench):
    assert bench.spread([1.1, 0.9, 1.0]) == "1.00x [0.90-1.10]"
