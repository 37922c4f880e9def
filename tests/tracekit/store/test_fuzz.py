"""Fuzzing a small real store: every command gives the right answer or reports damage in one line.

Each example copies a pristine store (format 1 and format 2; and a traced store, damaged in its
traces group only), damages one thing (a metadata
field, a tensor index entry, the bytes of a chunk or of a content-addressed object, or a file's
type) and runs `show`, `diff --exact --check-hashes` against the pristine copy and
`tracekit.open(...).load()`. None may raise a traceback or hang; exit 2 must be one `Error:` line;
and a diff may pass only when the damaged store still reads back the pristine values. Format 2
with --check-hashes checks every data byte (objects against their hashes, index rows against the
objects they name), so there any changed data byte must be reported, and a diff of the damaged
store against a copy of itself (`diff lie lie`: equal hashes on both sides, nothing compared)
must not pass either. The default diff decides equal hashes without reading their bytes: it may
pass over damaged bytes only with its note saying how many comparisons it decided by hash.
The example count is bounded per format (about 2 s each here; TRACEKIT_FUZZ_EXAMPLES sets it).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import tempfile

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracekit
from tracekit.cli.main import main
from tracekit.errors import TracekitError
from tracekit.testing import write_store

from tests.builders import small_run_data

EXAMPLES = int(os.environ.get("TRACEKIT_FUZZ_EXAMPLES", "25"))
HANG_S = 30  # a command still running after this is a hang: the test fails instead of CI stalling


@pytest.fixture(scope="module", params=[1, 2], ids=["format1", "format2"])
def pristine(request, tmp_path_factory):
    return write_store(tmp_path_factory.mktemp(f"fuzz{request.param}") / "ref", small_run_data(), format_version=request.param)


def _version(store: str) -> int:
    return json.load(open(os.path.join(store, "zarr.json")))["attributes"]["tracekit"]["format_version"]


def _files(store: str):
    out = []
    for folder, dirs, names in os.walk(store):
        dirs.sort()
        out += [os.path.relpath(os.path.join(folder, n), store) for n in sorted(names)]
    return out


def _meta_files(store):
    return [f for f in _files(store) if f.endswith("zarr.json") and not f.startswith(".tracekit")]


def _chunk_files(store):
    """Files holding data: chunk files of zarr arrays (`c/<row>/<col>`, or format 6's `c.<row>.<col>`),
    and (format 2) the content-addressed objects."""
    return [f for f in _files(store) if "/c/" in f or os.path.basename(f).startswith("c.")
            or (f.startswith("objects/") and not f.endswith("zarr.json"))]


def _leaves(doc, path=()):
    """Every (path, value) in a JSON document, containers included."""
    yield path, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _leaves(v, path + (i,))


HOSTILE = [None, -1, 0, 1, 7, 2**31, 2**63, 10**30, 1.5, math.inf, "", "x\n\x1b[31m", "a/b", [], {}, True,
           [1, 2, 3], [-5], {"a": 1}, "float32", "bfloat16", "nonsense"]

mutations = st.one_of(
    st.tuples(st.just("meta"), st.integers(0, 10**6), st.integers(0, 10**6), st.sampled_from(HOSTILE + ["<delete>"])),
    st.tuples(st.just("index"), st.integers(0, 10**6), st.sampled_from(["name", "dtype", "shape", "array", "offset", "numel"]),
              st.sampled_from(HOSTILE)),
    st.tuples(st.just("chunk"), st.integers(0, 10**6), st.sampled_from(["flip", "truncate", "append", "delete"]),
              st.integers(0, 10**6)),
    st.tuples(st.just("filetype"), st.integers(0, 10**6), st.sampled_from(["dir", "fifo", "devzero", "empty"]),
              st.booleans()),
)


def _apply(store: str, mutation, within: str | None = None) -> str:
    """Damage `store` as told (only files whose path holds `within`, if given); return the
    expectation class of what was done."""
    what = mutation[0]
    pick = (lambda fs: [f for f in fs if within in f]) if within else (lambda fs: fs)
    if what in ("meta", "index"):
        files = pick(_meta_files(store))
        if what == "index":
            files = [f for f in files if "tensors" in json.load(open(os.path.join(store, f))).get("attributes", {})]
        path = os.path.join(store, files[mutation[1] % len(files)])
        with open(path) as f:
            doc = json.load(f)
        if what == "meta":
            places = [p for p, _ in _leaves(doc) if p]
            place, value = places[mutation[2] % len(places)], mutation[3]
        else:
            entries = doc["attributes"]["tensors"]
            place, value = ("attributes", "tensors", mutation[1] % len(entries), mutation[2]), mutation[3]
        parent = doc
        for k in place[:-1]:
            parent = parent[k]
        if value == "<delete>":
            del parent[place[-1]]
        else:
            parent[place[-1]] = value
        with open(path, "w") as f:
            json.dump(doc, f)  # inf is written as Infinity: JSON that Python reads, strict parsers refuse
        return "metadata"
    if what == "chunk":
        path = os.path.join(store, (chunks := pick(_chunk_files(store)))[mutation[1] % len(chunks)])
        data = bytearray(open(path, "rb").read())
        op, n = mutation[2], mutation[3]
        if op == "flip":
            data[n % len(data)] ^= 1 << (n % 8)
        elif op == "truncate":
            data = data[: n % len(data)]
        elif op == "append":
            data += b"\x01" * (1 + n % 16)
        if op == "delete":
            os.unlink(path)
        else:
            open(path, "wb").write(bytes(data))
        if _version(store) >= 2:  # format 2 checks every data file's size, so extra bytes are damage too
            return "changed" if op == "flip" else "damaged"
        return {"flip": "changed", "append": "padded"}.get(op, "damaged")
    files = pick(_files(store))
    files = [f for f in files if not f.startswith(".tracekit")]
    path = os.path.join(store, files[mutation[1] % len(files)])
    os.unlink(path)
    kind = mutation[2]
    if kind == "dir":
        os.mkdir(path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "devzero":
        os.symlink("/dev/zero", path)
    else:
        open(path, "w").close()
    return "damaged"


@contextlib.contextmanager
def _deadline(what: str):
    def hang(signum, frame):
        raise AssertionError(f"{what} hung (over {HANG_S} s)")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(HANG_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _cli(*args):
    with _deadline(" ".join(args[:1])):
        result = CliRunner().invoke(main, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"tracekit {' '.join(args)} raised {result.exception!r}:\n{result.output}") from result.exception
    assert "Traceback" not in result.output
    if result.exit_code == 2:
        lines = [line for line in result.output.strip().splitlines() if line]
        # unusable input: one `Error:` line, or diff's structural report ending in its ERROR verdict line
        assert (len(lines) == 1 and lines[0].startswith("Error: ")) or lines[-1].startswith("ERROR comparison"), \
            result.output
    return result


def _reads_back_pristine(ref: str, cand: str) -> bool:
    """Whether the damaged store still reads as exactly the pristine values (through the reader)."""
    try:
        a, b = tracekit.open_store(ref), tracekit.open_store(cand)
        if a.ranks != b.ranks:
            return False
        for r in a.ranks:
            va, vb = a.rank(r), b.rank(r)
            if va.kinds != vb.kinds or va.completed_steps != vb.completed_steps:
                return False
            for kind in va.kinds:
                if va.steps(kind) != vb.steps(kind):
                    return False
                for step in va.steps(kind):
                    x, y = va.read_kind(kind, step), vb.read_kind(kind, step)
                    if x.keys() != y.keys() or any(x[k].tobytes() != y[k].tobytes() or x[k].shape != y[k].shape
                                                   for k in x):
                        return False
        return True
    except TracekitError:
        return False


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(mutation=mutations)
def test_damaged_store_is_the_right_answer_or_one_line(pristine, mutation):
    with tempfile.TemporaryDirectory() as tmp:
        cand = os.path.join(tmp, "cand")
        shutil.copytree(pristine, cand, symlinks=True)
        expect = _apply(cand, mutation)

        show = _cli("show", cand)
        assert show.exit_code in (0, 2)

        fast = _cli("diff", pristine, cand, "--exact")  # the default: equal hashes decided unread
        assert fast.exit_code in (0, 1, 2)
        if fast.exit_code == 0 and not _reads_back_pristine(pristine, cand):
            assert "decided by hash:" in fast.output, f"{mutation}: PASS over other values without saying why"

        diff = _cli("diff", pristine, cand, "--exact", "--check-hashes")
        assert diff.exit_code in (0, 1, 2)
        if expect == "changed":
            assert diff.exit_code != 0, f"{mutation}: passed over changed bytes"
        if expect == "damaged":
            assert diff.exit_code != 0, f"{mutation}: passed over a damaged store"
        if diff.exit_code == 0:
            assert _reads_back_pristine(pristine, cand), f"{mutation}: PASS, yet the store reads other values"

        if _version(pristine) >= 2 and expect in ("changed", "damaged"):
            # `diff lie lie`: both sides hold the same hashes, so no tensor is compared; the bytes
            # behind those hashes must still be checked, and the damage reported
            twin = os.path.join(tmp, "twin")
            shutil.copytree(pristine, twin, symlinks=True)
            _apply(twin, mutation)  # the same damage again (a FIFO cannot be copied)
            lie = _cli("diff", cand, twin, "--exact", "--check-hashes")
            assert lie.exit_code != 0, f"{mutation}: a damaged store passed against a copy of itself"

        with _deadline("tracekit.open"):
            try:
                tree = tracekit.open(cand)
                for node in tree.children.values():
                    node.to_dataset().load()
            except TracekitError:
                pass


def test_the_fuzz_oracle_can_fail(pristine, tmp_path):
    """A flipped data bit is a FAIL (format 1) or damage (format 2) under --exact, so the 'changed'
    expectation is not vacuous; in format 2, also against a copy of the damaged store itself."""
    cand = str(tmp_path / "cand")
    shutil.copytree(pristine, cand)
    assert _cli("diff", pristine, cand, "--exact").exit_code == 0
    if _version(pristine) == 1:
        assert _apply(cand, ("chunk", 0, "flip", 3)) == "changed"
        assert _cli("diff", pristine, cand, "--exact").exit_code == 1
        return
    objects = [i for i, f in enumerate(_chunk_files(cand)) if f.startswith("objects/")]
    assert _apply(cand, ("chunk", objects[0], "flip", 3)) == "changed"
    twin = str(tmp_path / "twin")
    shutil.copytree(cand, twin)
    for ref in (pristine, twin):
        result = _cli("diff", ref, cand, "--exact", "--check-hashes")
        assert result.exit_code == 2 and "damaged store" in result.output, result.output
        # the default does not read bytes whose hashes agree, and says so
        fast = _cli("diff", ref, cand, "--exact")
        assert fast.exit_code == 0 and "decided by hash:" in fast.output, fast.output


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("index", ["hash", "finite"])
def test_a_fifo_for_an_index_arrays_metadata_is_one_line_not_a_hang(tmp_path, index):
    """zarr blocks forever opening a FIFO (a thread of its own pool: the process then cannot even
    exit). A FIFO in the place of a format 2 index array's zarr.json must be refused before zarr
    looks: by tracekit.open and by diff, each in a process of its own, within the deadline."""
    import subprocess
    import sys

    ref = write_store(tmp_path / "ref", small_run_data(), format_version=2)
    cand = str(tmp_path / "cand")
    shutil.copytree(ref, cand)
    meta = os.path.join(cand, "rank_0", "parameters", index, "zarr.json")
    os.unlink(meta)
    os.mkfifo(meta)
    code = ("import sys, tracekit\nfrom tracekit.errors import TracekitError\ntry:\n"
            " t = tracekit.open(sys.argv[1])\n [n.to_dataset().load() for n in t.children.values()]\n"
            "except TracekitError as e:\n print('refused:', e)\n")
    for argv in ([sys.executable, "-c", code, cand], [sys.executable, "-m", "tracekit.cli.main", "diff", ref, cand]):
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=HANG_S * 2)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{argv[1:3]} hung on a FIFO {index}/zarr.json")
        text = out.stdout + out.stderr
        assert "is not a regular file" in text, text
        assert "Traceback" not in text


# Traced stores (docs/FORMAT.md, "Traces"): the same damage to the files of the traces group only.
# zarr's zstd chunks carry no checksum, so a flipped bit may decode to other events: diff's trace
# comparison does not gate the verdict, so there the oracle is only "no traceback, no hang, exit 2
# is one line" (and verify likewise), for diff, report's verdict path and verify.
TRACE_EXAMPLES = max(1, EXAMPLES // 3)


def _verify(store: str):
    """verify's answer: one line per problem and its summary line, never a traceback or hang."""
    with _deadline("verify"):
        result = CliRunner().invoke(main, ["verify", store])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"tracekit verify raised {result.exception!r}:\n{result.output}") from result.exception
    lines = result.output.strip().splitlines()
    assert result.exit_code in (0, 2) and "Traceback" not in result.output, result.output
    assert lines[-1].startswith("verify: ") or (len(lines) == 1 and lines[0].startswith("Error: ")), result.output
    assert all(ln.startswith("damaged: ") for ln in lines[:-1]), result.output
    return result


def _traced_events(step):
    return [{"index": i, "phase": "fwd", "module": f"layer.{i % 3}", "op": "aten.mm.default", "call": i,
             "args": [{"t": 0}, i * step], "inputs": [{"shape": [2, 3], "dtype": "float32", "hash": f"xxh3_64:{i:016x}"}],
             "outputs": []} for i in range(12)]


@pytest.fixture(scope="module")
def traced_pristine(tmp_path_factory):
    data = small_run_data()
    traces = {r: {s: {"ops": _traced_events(s), "modules": _traced_events(s)[:3]} for s in (1, 3)} for r in data}
    return write_store(tmp_path_factory.mktemp("fuzztraced") / "ref", data, traces=traces)


@settings(max_examples=TRACE_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(mutation=mutations.filter(lambda m: m[0] != "index"))  # trace groups hold no tensor index
def test_damaged_trace_is_one_line_never_a_traceback_or_hang(traced_pristine, mutation):
    with tempfile.TemporaryDirectory() as tmp:
        cand = os.path.join(tmp, "cand")
        shutil.copytree(traced_pristine, cand, symlinks=True)
        _apply(cand, mutation, within="/traces/")
        assert _cli("show", cand).exit_code in (0, 2)
        assert _cli("diff", traced_pristine, cand, "--exact").exit_code in (0, 2)
        _verify(cand)


def test_the_traced_fuzz_store_compares_its_traces(traced_pristine, tmp_path):
    """The traces are read, so damage there is reached: a garbage events chunk is exit 2."""
    cand = str(tmp_path / "cand")
    shutil.copytree(traced_pristine, cand)
    assert _cli("diff", traced_pristine, cand, "--exact").exit_code == 0
    chunk = os.path.join(cand, "rank_1", "traces", "ops", "step_3", "events", "c", "0")
    open(chunk, "wb").write(b"\x00" * 50)
    result = _cli("diff", traced_pristine, cand, "--exact")
    assert result.exit_code == 2 and "rank 1 trace of ops at step 3" in result.output, result.output
    assert _verify(cand).exit_code == 2
