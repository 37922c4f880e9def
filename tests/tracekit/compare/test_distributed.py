"""The diff on dask.distributed gives the one-process report, from local folders and from a bucket."""

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

import tracekit
from tracekit.cli.main import main
from tracekit.compare.distributed import step_ranges
from tracekit.errors import StoreError, UsageError
from tracekit.testing import write_store


def _runs(seed, steps=6, ranks=2):
    rng = np.random.default_rng(0)
    base = {n: rng.standard_normal(shape).astype(np.float32) for n, shape in
            (("a", (37, 11)), ("b", (300,)), ("c", (5,)))}
    noise = np.random.default_rng(seed)
    out = {}
    for r in range(ranks):
        out[r] = {}
        for s in range(1, steps + 1):
            grads = {n: (v * s + r + (noise.standard_normal(v.shape).astype(np.float32) * 1e-3 * (s > 3))).astype(np.float32)
                     for n, v in base.items()}
            out[r][s] = {"loss": {"loss": np.float32(1 / s)}, "gradients": grads,
                         "parameters": {"w": base["a"] - s + (r == 1) * (s == 5) * 0.5}}
    return out


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Two local stores whose chunks are 256 bytes, so one tensor spans many chunks (many units)."""
    mp = pytest.MonkeyPatch()
    mp.setattr("tracekit.store.writer.MAX_CHUNK_BYTES", 256)
    folder = tmp_path_factory.mktemp("dist")
    ref = write_store(folder / "ref", _runs(0))
    cand = write_store(folder / "cand", _runs(1))
    mp.undo()
    return ref, cand


@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address="127.0.0.1:0") as c:
        yield c.scheduler_address


def _same(report) -> str:
    d = report.to_dict()
    d["stats"].pop("seconds")  # wall time is the one thing that differs
    return json.dumps(d, sort_keys=True, default=str)


def test_step_ranges_cover_every_step_once_in_order():
    steps = list(range(1, 11))
    for pairs, slots in ((1, 1), (4, 2), (100, 8), (3, 64)):
        ranges = step_ranges(steps, pairs, slots)
        assert [s for r in ranges for s in r] == steps
    assert step_ranges(steps, 1, 1) == [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10]]  # ~4 tasks per slot
    assert step_ranges(steps, 8, 4) == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]  # 16 tasks for 4 slots
    assert step_ranges(steps, 2, 64) == [[s] for s in steps]  # never less than one step a task


@pytest.mark.parametrize("options", [{"details": "all"}, {"fail_fast": True}, {"align": "global", "kinds": ["gradients"]}])
def test_scheduler_report_is_the_one_process_report(stores, cluster, options):
    ref, cand = stores
    here = tracekit.diff(ref, cand, **options)
    there = tracekit.diff(ref, cand, scheduler=cluster, **options)
    assert here.results or here.summary
    assert _same(there) == _same(here)
    if options.get("fail_fast"):
        assert there.stopped_early and there.steps == here.steps


def test_workers_start_a_local_cluster_with_the_same_verdict(divergence_runs):
    ref, cand = divergence_runs
    here = tracekit.diff(ref, cand)
    there = tracekit.diff(ref, cand, workers=2)
    assert not here.passed
    assert _same(there) == _same(here)


def test_workers_read_a_bucket_store_themselves(s3, stores, cluster):
    """The cluster's workers started without credentials: the storage options given here reach them."""
    from tracekit.store.location import storage_options_scope

    ref, cand = stores
    s3.fs.put(cand, f"{s3.bucket}/cand", recursive=True)
    here = tracekit.diff(ref, cand, details="all")
    with storage_options_scope({"key": "k", "secret": s3.secret}):
        there = tracekit.diff(ref, s3.url("cand"), scheduler=cluster, details="all")
    d_here, d_there = json.loads(_same(here)), json.loads(_same(there))
    assert d_there.pop("cand")["path"] == s3.url("cand")
    d_here.pop("cand")
    assert d_there == d_here


def test_damage_found_on_a_worker_is_the_same_one_line_error(tmp_path, stores, cluster):
    import shutil

    from tracekit.testing import tensor_bytes

    ref, cand = stores
    broken = shutil.copytree(cand, tmp_path / "broken")
    digests = tracekit.open_store(str(broken)).rank(1).digests("gradients", 3)
    name = sorted(digests)[0]
    file = tensor_bytes(broken, 1, "gradients", 3, name)[0]
    in_file = {n for n in digests if tensor_bytes(broken, 1, "gradients", 3, n)[0] == file}  # a pack's members
    os.unlink(file)
    with pytest.raises(StoreError) as here:
        tracekit.diff(ref, str(broken), trust_index=False)  # read back too the objects whose hashes agree
    with pytest.raises(StoreError) as there:
        tracekit.diff(ref, str(broken), scheduler=cluster, trust_index=False)
    assert str(there.value) == str(here.value)
    assert any(f"damaged store: {broken}: rank 1 gradients step 3 tensor {n}: its object" in str(there.value) for n in in_file)
    assert "is missing" in str(there.value)


@pytest.mark.parametrize("address", ["bogus", "tcp://127.0.0.1:9"], ids=["not-an-address", "nothing-listens"])
def test_a_failed_scheduler_leaves_dask_as_it_was(stores, monkeypatch, address):
    """A client that could not connect must not stay the process's default: dask would send every
    later computation (tracekit.open's lazy arrays, the user's) to it, and they would wait forever."""
    import dask
    distributed = pytest.importorskip("distributed")
    monkeypatch.setattr("tracekit.compare.distributed.SCHEDULER_CONNECT_TIMEOUT_S", 1)
    before = dask.config.get("scheduler", None)
    with pytest.raises(UsageError, match="cannot connect"):
        tracekit.diff(*stores, scheduler=address)
    assert dask.config.get("scheduler", None) == before
    with pytest.raises(ValueError):  # "No clients found"
        distributed.default_client()


def test_cli_scheduler_flag_and_an_unreachable_scheduler(stores, cluster, monkeypatch):
    ref, cand = stores
    plain = CliRunner().invoke(main, ["diff", ref, cand])
    dask = CliRunner().invoke(main, ["diff", "--scheduler", cluster, ref, cand])
    assert plain.exit_code == dask.exit_code == 1
    assert plain.output.splitlines()[-1] == dask.output.splitlines()[-1]
    # nothing listens on port 9: the client retries until its connect timeout (10 s; 1 s here)
    monkeypatch.setattr("tracekit.compare.distributed.SCHEDULER_CONNECT_TIMEOUT_S", 1)
    with pytest.raises(UsageError, match="cannot connect"):
        tracekit.diff(ref, cand, scheduler="tcp://127.0.0.1:9")


def test_the_dask_executor_never_imports_the_engine_back():
    """The engine chooses its executor (threads here, Dask workers) and hands the Dask one the task
    its workers run: compare/distributed.py loads without the engine."""
    import subprocess
    import sys

    code = ("import sys, tracekit.compare.distributed as d\n"
            "print('tracekit.compare.engine' in sys.modules, callable(d.DaskExecutor.compare_steps))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True"]
    # nor later, inside a function run on a worker (it used to import the engine's _Engine there)
    import ast

    import tracekit.compare.distributed as d

    tree = ast.parse(open(d.__file__).read())
    imported = ({n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
                | {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names})
    assert "distributed" in imported and not [m for m in imported if m and m.endswith("engine")]
