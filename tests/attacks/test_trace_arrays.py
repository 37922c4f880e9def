"""Issue 39, read side: trace arrays are bounded like tensor arrays. A declared shape the stored
bytes cannot hold, a garbage chunk, a chunk that expands beyond its declared size, or a FIFO among
the trace files is one `Error: damaged store ...` line and exit 2 from diff and report, a named
problem from verify (exit 2), never a traceback, a hang or gigabytes of memory."""

import json
import os
import resource
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from tracekit.cli.main import main
from tracekit.testing import write_store

EVENTS = "rank_0/traces/ops/step_2/events"
MEMORY_LIMIT = 768 << 20  # address space of the commands run under a limit; the bomb expands to 2 GiB


def _events(n=200):
    return [{"index": i, "phase": "fwd", "module": "layer", "op": "aten.mm.default", "call": i, "args": [],
             "inputs": [], "outputs": []} for i in range(n)]


def _data():
    return {0: {s: {"loss": {"loss": np.float32(1.0 / s)}} for s in range(1, 4)}}


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    return write_store(tmp_path_factory.mktemp("traced") / "ref", _data(), traces={0: {2: {"ops": _events()}}})


def zstd_bomb(total: int, declare_size: bool = True) -> bytes:
    """A zstd frame of RLE blocks expanding to `total` zero bytes (4 bytes per 128 KiB): 2 GiB in 64 KiB."""
    out = bytearray(struct.pack("<I", 0xFD2FB528))
    out += bytes([0b11100000]) + struct.pack("<Q", total) if declare_size else bytes([0x00, 0x38])
    block, n = 1 << 17, total >> 17
    for i in range(n):
        out += struct.pack("<I", (block << 3) | (1 << 1) | (i == n - 1))[:3] + b"\x00"
    return bytes(out)


def _set_shape(store, shape, chunk=None):
    path = os.path.join(store, EVENTS, "zarr.json")
    doc = json.load(open(path))
    doc["shape"] = [shape]
    if chunk is not None:
        doc["chunk_grid"]["configuration"]["chunk_shape"] = [chunk]
    json.dump(doc, open(path, "w"))


def _write_chunk(store, data):
    open(os.path.join(store, EVENTS, "c", "0"), "wb").write(data)


def _fifo(store, rel):
    os.unlink(os.path.join(store, rel))
    os.mkfifo(os.path.join(store, rel))


def _malformed_event(store):
    """Events that decode and are JSON, one of them not an event: a phase that is a number."""
    events = _events()
    events[3]["phase"] = 7
    payload = np.frombuffer(json.dumps(events).encode(), dtype=np.uint8)
    zarr.create_array(os.path.join(store, EVENTS), data=payload, overwrite=True)


DAMAGE = {
    "malformed_event": (_malformed_event, "malformed events (event 3: event phase is 7"),
    "shape_1e12": (lambda s: _set_shape(s, 10**12, 10**12), "more than its"),
    "shape_1e12_chunks_unchanged": (lambda s: _set_shape(s, 10**12), "chunks, more than the"),
    "garbage_chunk": (lambda s: _write_chunk(s, os.urandom(700)), "not a zstd frame"),
    "bomb_declared": (lambda s: (_write_chunk(s, zstd_bomb(2 << 30)), _set_shape(s, 2 << 30, 2 << 30)), "more than its"),
    "bomb_undeclared": (lambda s: _write_chunk(s, zstd_bomb(2 << 30)), "its zstd frame declares 2147483648 bytes"),
    "bomb_without_size": (lambda s: _write_chunk(s, zstd_bomb(2 << 30, declare_size=False)), "not a zstd frame that declares"),
    "fifo_chunk": (lambda s: _fifo(s, EVENTS + "/c/0"), "is not a regular file"),
    "fifo_metadata": (lambda s: _fifo(s, "rank_0/traces/ops/zarr.json"), "is not a regular file"),
}


def _cli(*args):
    return CliRunner().invoke(main, [os.fspath(a) for a in args])


def _one_damage_line(result, fragment):
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: damaged store") and fragment in lines[0], result.output


@pytest.fixture(params=sorted(DAMAGE))
def damaged(request, traced, tmp_path):
    cand = shutil.copytree(traced, tmp_path / "cand")
    damage, fragment = DAMAGE[request.param]
    damage(cand)
    return cand, fragment


def test_the_clean_traced_pair_diffs_and_verifies(traced, tmp_path):
    assert _cli("diff", traced, traced).exit_code == 0
    assert _cli("verify", traced).output.startswith("verify: OK")


def test_diff_and_report_say_one_line(traced, damaged, tmp_path):
    cand, fragment = damaged
    _one_damage_line(_cli("diff", traced, cand), fragment)
    _one_damage_line(_cli("report", traced, cand, "-o", tmp_path / "r.html"), fragment)


def test_verify_names_it_and_show_does_not_break(damaged):
    cand, fragment = damaged
    result = _cli("verify", cand)
    problems = [ln for ln in result.output.splitlines() if ln.startswith("damaged: rank 0 traces")]
    assert result.exit_code == 2 and len(problems) == 1 and fragment in problems[0], result.output
    shown = _cli("show", cand)
    assert shown.exit_code == 0 and "Traceback" not in shown.output


HUNGRY = ["bomb_declared", "bomb_undeclared", "shape_1e12"]

# Runs each (what, args) of a JSON list in turn in this one process, and prints each one's exit code
# and output as JSON: "cli" is `tracekit ARGS`, "zarr" reads the array at ARGS[0] with plain zarr.
UNDER_LIMIT = """
import contextlib, io, json, sys, traceback
results = []
for what, args in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            if what == "cli":
                from tracekit.cli.main import main
                main(args, prog_name="tracekit")
            else:
                import zarr
                zarr.open_array(args[0], mode="r")[:]
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
    results.append({"code": code, "output": out.getvalue()})
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def under_memory_limit(traced, tmp_path_factory):
    """damage -> [(command, exit code, output)]: for each damage of HUNGRY, `diff` and `verify` of
    the damaged copy, and plain zarr reading its events array, all run in one process under the
    address-space limit (one interpreter start instead of eight; each command also runs with what
    the ones before it left allocated, so the limit is no looser than in a process of its own)."""
    jobs = []
    for damage in HUNGRY:
        cand = shutil.copytree(traced, tmp_path_factory.mktemp(damage) / "cand")
        DAMAGE[damage][0](cand)
        jobs += [(damage, "cli", ["diff", str(traced), str(cand)]), (damage, "cli", ["verify", str(cand)])]
        if damage != "bomb_undeclared":  # zarr would size its output from the frame's header there
            jobs.append((damage, "zarr", [os.path.join(cand, EVENTS)]))

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    out = subprocess.run([sys.executable, "-c", UNDER_LIMIT, json.dumps([job[1:] for job in jobs])],
                         capture_output=True, text=True, preexec_fn=limit, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    results = json.loads(out.stdout.splitlines()[-1])
    by_damage = {damage: [] for damage in HUNGRY}
    for (damage, what, args), result in zip(jobs, results, strict=True):
        by_damage[damage].append((what if what == "zarr" else args[0], result["code"], result["output"] + out.stderr))
    return by_damage


@pytest.mark.parametrize("damage", HUNGRY)
def test_memory_hungry_traces_are_refused_under_a_memory_limit(under_memory_limit, damage):
    """Under a 768 MiB address-space limit the commands still answer in one line. The limit bites:
    zarr itself, reading the same array, runs out of memory under it."""
    answers = {what: (code, output) for what, code, output in under_memory_limit[damage]}
    for command in ("diff", "verify"):
        code, output = answers[command]
        assert code == 2 and "Traceback" not in output, (command, output)
    if damage != "bomb_undeclared":
        code, output = answers["zarr"]
        assert code != 0 and "MemoryError" in output, output[-500:]


def test_a_full_tensor_whose_attributes_lie_is_damage(tmp_path):
    """A --trace-full tensor's shape attribute must match its array."""
    from tracekit.store import RankWriter, TensorData, create_store
    from tracekit.store.traces import TraceWriter

    stores = []
    for name in ("ref", "cand"):
        path = str(tmp_path / name)
        create_store(path, {})
        w = RankWriter(path, 0, {"coords": {"rank": 0}})
        w.write(1, "loss", [TensorData("loss", "float32", (), np.float32(1))])
        TraceWriter(w.zarr_group()).write_step("ops", 1, _events(3), [TensorData("0.out0", "float32", (4,), np.arange(4, dtype=np.float32))])
        w.complete_step(1)
        w.close()
        stores.append(path)
    meta = os.path.join(stores[1], "rank_0/traces/ops/step_1/full/0.out0/zarr.json")
    doc = json.load(open(meta))
    doc["attributes"]["shape"] = [10**12]
    json.dump(doc, open(meta, "w"))
    result = _cli("verify", stores[1])
    assert result.exit_code == 2 and "full tensor 0.out0: its shape [1000000000000] does not match" in result.output
