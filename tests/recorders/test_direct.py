"""A step's capture written straight into its spool entry (recorders/direct.py, Handoff slabs):
the entry is the one the general path writes, the store holds the loop's tensors bit for bit
whether a slab is fresh or reused, and steps the plan did not foresee fall back to the general path."""

import os

import numpy as np
import pytest
import torch

from tracekit import open_store
from tracekit.recorders import Recorder
from tracekit.writer import handoff as handoff_module
from tracekit.launch.config import RecordConfig
from tracekit.recorders.direct import DirectCapture
from tracekit.writer.handoff import Handoff, Slab
from tracekit.writer.spool import DIGEST_RECORD, read_entry, write_entry
from tracekit.store import create_store
from tracekit.store.keep import parse_full
from tracekit.store.tensors import from_torch


class _FakeHandoff:
    """Slabs in a folder; what is handed over is kept for the test to read."""

    def __init__(self, folder, max_bytes=1 << 40):
        self.folder, self.made, self.free, self.handed, self.budgets = folder, 0, [], [], []
        self.max_bytes = max_bytes  # the queue cap

    def slab(self, size, budget=None):
        self.budgets.append(budget)
        if self.free:
            slab = self.free.pop()
            slab.fresh = False  # as Handoff.slab: reused pages, unless the size changes
            slab.resize(size)
            return slab
        self.made += 1
        return Slab(os.path.join(self.folder, f"slab-{self.made}"), size)

    def release(self, slab):
        self.free.append(slab)

    def provisional_slab(self, step, slab):
        self.handed.append((step, slab, slab.array.tobytes()))


def _bits(t):
    return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_entry_filled_in_place_is_the_one_write_entry_writes(tmp_path, dtype):
    torch.manual_seed(0)
    # m: over one summaries.BLOCK, so a fresh slab's delta is written in several blocks
    params = [("w", torch.randn(5, 3, dtype=dtype)), ("b", torch.randn(3, dtype=dtype)), ("m", torch.randn(300, 240, dtype=dtype))]
    grads = [("w", torch.randn(5, 3, dtype=dtype)), ("b", torch.randn(3, dtype=dtype)), ("m", torch.randn(300, 240, dtype=dtype))]
    staged = {"outputs": {"output": torch.randn(2, 3, dtype=dtype)}, "loss": {"loss": torch.tensor(0.5)}}
    handoff = _FakeHandoff(str(tmp_path))
    buffers = {}
    for round_ in range(3):  # fresh slab (pwrite), then reused ones (through the mapping)
        before = {n: p.clone() for n, p in params}
        grad_copies = {n: g.clone() for n, g in grads}
        cap = DirectCapture.begin(handoff, 7, staged, grads, params, True, True, buffers)
        assert cap is not None and cap.slab.fresh == (round_ == 0)
        for (_, p), (_, g) in zip(params, grads):
            p.add_(0.125 * (round_ + 1))  # the update, in place
            g.mul_(3)  # a loop that changes gradients after the snapshot: the entry keeps the old ones
        assert cap.capture(staged, dict(params))
        expected = [(k, from_torch(n, t)) for k, ts in staged.items() for n, t in ts.items()]
        expected += [("gradients", from_torch(n, grad_copies[n])) for n, _ in grads]
        expected += [("parameters", from_torch(n, p)) for n, p in params]
        expected += [("deltas", from_torch(n, p - before[n])) for n, p in params]
        path = tmp_path / "general.part"
        write_entry(str(path), 7, True, expected)
        step, slab, data = handoff.handed[-1]
        if round_ == 0:  # a fresh slab's padding is zeros: the very same bytes
            assert data == path.read_bytes()
        mine, theirs = read_entry(slab.path), read_entry(str(path))
        try:
            assert (mine.step, mine.complete) == (theirs.step, theirs.complete)
            assert list(mine.kinds) == list(theirs.kinds)
            for kind in theirs.kinds:
                for a, b in zip(mine.kinds[kind], theirs.kinds[kind], strict=True):
                    assert (a.name, a.dtype, a.shape, a.shard) == (b.name, b.dtype, b.shape, b.shard)
                    assert a.data.tobytes() == b.data.tobytes()
        finally:
            mine.close()
            theirs.close()
        handoff.release(slab)
    assert handoff.made == 1  # one file, reused


def test_the_plan_is_reused_while_the_tensors_match_it_and_made_anew_when_one_changes(tmp_path):
    """begin() keeps the last step's plan while every tensor matches it (the same list, no new
    objects a step: docs/RELIABILITY.md, the collector); a tensor of another shape, a dtype, or one
    tensor more gets a new plan, laid out for the new tensors (what write_entry writes)."""
    params = [("w", torch.randn(5, 3)), ("b", torch.randn(3))]
    grads = [("w", torch.randn(5, 3)), ("b", torch.randn(3))]
    staged = {"loss": {"loss": torch.tensor(0.5)}}
    handoff = _FakeHandoff(str(tmp_path))
    buffers = {}
    plans = []
    changes = [None, None, ("b", torch.randn(4)), ("b", torch.randn(4, dtype=torch.float64)), ("c", torch.randn(2))]
    for change in changes:
        if change is not None:
            name, value = change
            params = [(n, p) for n, p in params if n != name] + [(name, value)]
            grads = [(n, g) for n, g in grads if n != name] + [(name, value.clone())]
        cap = DirectCapture.begin(handoff, 3, staged, grads, params, True, True, buffers)
        assert cap is not None
        plans.append(cap.plan)
        assert cap.capture(staged, dict(params))
        expected = [("loss", from_torch("loss", staged["loss"]["loss"]))]
        expected += [("gradients", from_torch(n, g)) for n, g in grads]
        expected += [("parameters", from_torch(n, p)) for n, p in params]
        expected += [("deltas", from_torch(n, p - p)) for n, p in params]
        write_entry(str(tmp_path / "general.part"), 3, True, expected)
        _, slab, _ = handoff.handed[-1]
        mine, theirs = read_entry(slab.path), read_entry(str(tmp_path / "general.part"))
        try:
            assert [(k, t.name, t.dtype, t.shape) for k, ts in mine.kinds.items() for t in ts] == \
                [(k, t.name, t.dtype, t.shape) for k, ts in theirs.kinds.items() for t in ts]
        finally:
            mine.close()
            theirs.close()
        handoff.release(slab)
    assert plans[1] is plans[0]  # unchanged tensors: the same plan
    assert all(plans[i] is not plans[i - 1] for i in (2, 3, 4))  # shape, dtype, one more: new ones
    assert plans[2] != plans[1] and plans[3] != plans[2] and len(plans[4]) == len(plans[3]) + 3


def _train(model, opt, steps, rec, clones, flush=False):
    for step in range(1, steps + 1):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(16, 8, generator=g)
        out = model(x)
        loss = out.square().mean()
        loss.backward()
        rec.observe(output=out, loss=loss)
        clones[step] = {"output": out.detach().clone(), "loss": loss.detach().clone(),
                        "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
                        "before": {n: p.detach().clone() for n, p in model.named_parameters()}}
        opt.step()
        opt.zero_grad()
        clones[step]["after"] = {n: p.detach().clone() for n, p in model.named_parameters()}
        if flush:
            rec.flush()  # the writer is done with every entry: the next step reuses a slab


def _assert_recorded(store, clones, names=None):
    rank = open_store(store).rank(0)
    assert rank.completed_steps == sorted(clones)
    for step, c in clones.items():
        assert np.array_equal(rank.read_bits("outputs", step, "output"), _bits(c["output"]).reshape(-1))
        assert np.array_equal(rank.read_bits("loss", step, "loss"), _bits(c["loss"]).reshape(-1))
        for name in names or c["grads"]:
            stored = name.replace("_fsdp_wrapped_module.", "")
            assert np.array_equal(rank.read_bits("gradients", step, stored), _bits(c["grads"][name]).reshape(-1))
            assert np.array_equal(rank.read_bits("parameters", step, stored), _bits(c["after"][name]).reshape(-1))
            delta = c["after"][name] - c["before"][name]
            assert np.array_equal(rank.read_bits("deltas", step, stored), _bits(delta).reshape(-1))


@pytest.mark.parametrize("flush", [False, True])
def test_steps_recorded_through_slabs_equal_the_loop_tensors_bitwise(tmp_path, flush):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    clones = {}
    with Recorder(model, opt, store=str(tmp_path / "s")) as rec:
        _train(model, opt, 6, rec, clones, flush=flush)
        made = rec._handoff._slabs_made
    assert made >= 1  # the steps went through slabs
    if flush:
        assert made <= 2  # and the writer's finished ones were reused
    _assert_recorded(tmp_path / "s", clones)


def test_pieces_of_fsdp2_parameters_go_through_slabs_bitwise(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "pg"), 1), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
        mesh = init_device_mesh("cpu", (1,))
        for m in model:
            if isinstance(m, torch.nn.Linear):
                fully_shard(m, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        clones = {}

        def full(t):
            return t.full_tensor() if hasattr(t, "full_tensor") else t

        with Recorder(model, opt, store=str(tmp_path / "s")) as rec:
            for step in range(1, 4):
                out = model(torch.randn(4, 8, generator=torch.Generator().manual_seed(step)))
                loss = out.square().mean()
                loss.backward()
                rec.observe(output=out, loss=loss)
                clones[step] = {"output": out.detach().clone(), "loss": loss.detach().clone(),
                                "grads": {n: full(p.grad).clone() for n, p in model.named_parameters()},
                                "before": {n: full(p.detach()).clone() for n, p in model.named_parameters()}}
                opt.step()
                opt.zero_grad()
                clones[step]["after"] = {n: full(p.detach()).clone() for n, p in model.named_parameters()}
            assert rec._handoff._slabs_made >= 1 and rec._pieces
        _assert_recorded(tmp_path / "s", clones)
        rank = open_store(tmp_path / "s").rank(0)
        assert rank.tensor("gradients", "0.weight") is not None
    finally:
        dist.destroy_process_group()


def test_a_step_that_no_longer_matches_its_plan_falls_back_bitwise(tmp_path):
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4, 3))
    rec = Recorder(params={"w": w}, store=str(tmp_path / "s")).start()
    clones = {}
    try:
        for step in (1, 2):
            out = w.sum(dim=0) * 2
            out.sum().backward()
            clones[step] = {"grads": {"w": w.grad.clone()}, "before": {"w": w.detach().clone()}}
            if step == 1:
                rec.observe(output=out.detach(), loss=out.sum().detach())
            rec.begin_step()
            assert rec._direct is not None
            with torch.no_grad():
                w.sub_(0.5 * w.grad)
            w.grad.zero_()  # gradients changed after the snapshot: the entry keeps those of begin_step
            if step == 2:  # staged after begin_step: the plan has no place for it, the general path records it
                rec.observe(output=out.detach(), loss=out.sum().detach())
            clones[step].update(output=out.detach().clone(), loss=out.sum().detach().clone(),
                                after={"w": w.detach().clone()})
            rec.end_step()
        assert len(rec._handoff._free_slabs) >= 1  # the unused slab went back
    finally:
        rec.close()
    _assert_recorded(tmp_path / "s", clones)


def test_a_further_capture_of_the_step_replaces_the_first(tmp_path):
    """Zero-code captures again after each optimizer of a step: the last capture is the step."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4, 3))
    rec = Recorder(params={"w": w}, store=str(tmp_path / "s")).start()
    try:
        out = (w * 3).sum(dim=0)
        out.sum().backward()
        rec.observe(output=out.detach(), loss=out.sum().detach())
        clones = {1: {"grads": {"w": w.grad.clone()}, "before": {"w": w.detach().clone()},
                      "output": out.detach().clone(), "loss": out.sum().detach().clone()}}
        rec.begin_step()
        with torch.no_grad():
            w.sub_(0.5)
        rec.capture_after()
        with torch.no_grad():
            w.mul_(0.25)  # a second optimizer of the same step
        rec.capture_after()
        clones[1]["after"] = {"w": w.detach().clone()}
        rec.finish_step()
    finally:
        rec.close()
    _assert_recorded(tmp_path / "s", clones)


def test_a_full_spool_filesystem_is_a_one_line_writer_failure(tmp_path, monkeypatch):
    """tmpfs out of room: pwrite() raises ENOSPC, and the recorder says it as the general path does
    (a write through a mapping there would be a SIGBUS: slabs are mapped only once their pages exist)."""
    import errno

    from tracekit.writer.handoff import WriterFailed

    w = torch.nn.Parameter(torch.randn(4, 3))
    rec = Recorder(params={"w": w}, store=str(tmp_path / "s")).start()
    try:
        w.sum().backward()
        real = os.pwrite

        def full(fd, data, offset):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "pwrite", full)
        with pytest.raises(WriterFailed, match="cannot spool step 1: .*No space left"):
            rec.begin_step()
        monkeypatch.setattr(os, "pwrite", real)
    finally:
        rec.close("failed")


def test_a_slab_whose_size_changes_is_filled_with_pwrite_again(tmp_path):
    slab = Slab(str(tmp_path / "slab-1"), 4096)
    try:
        slab.write_at(0, np.full(4096, 7, dtype=np.uint8))
        slab.fresh = False
        slab.resize(4096)
        assert not slab.fresh and slab.array[:3].tolist() == [7, 7, 7]
        slab.resize(3 * 4096)  # the new pages are holes: no writes through the mapping there
        assert slab.fresh and slab.size == os.path.getsize(slab.path) == 3 * 4096
    finally:
        slab.discard()
    assert not os.path.exists(slab.path)


@pytest.mark.skipif(not hasattr(__import__("mmap"), "MAP_POPULATE") or not os.path.isdir("/dev/shm"),
                    reason="MAP_POPULATE and /dev/shm are Linux's")
def test_a_reused_slab_is_mapped_with_its_pages_and_a_fresh_one_without():
    import resource
    import tempfile

    # in tmpfs, as spools are (a file on a disk still takes faults at its first writes through a
    # populated mapping, 524 of 2048 pages on this machine's ext4: it tracks which pages are dirtied)
    folder = tempfile.mkdtemp(dir="/dev/shm", prefix="tracekit-test-")
    size = 8 << 20  # 2048 pages: unpopulated, the first fill through the mapping faults once per page
    slab, array = Slab(os.path.join(folder, "slab-1"), size), None
    try:
        _ = slab.array  # a fresh slab's mapping allocates nothing: its pages come with pwrite()
        assert os.stat(slab.path).st_blocks * 512 < size // 8
        slab.resize(size - 4096)  # unmapped; then filled the way a fresh slab is
        slab.write_at(0, np.full(size - 4096, 3, dtype=np.uint8))
        slab.fresh = False  # reused (Handoff.slab)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        array = slab.array
        array[:] = 5
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        assert faults < 256, faults
        assert int(array[::4096].min()) == 5
    finally:
        del array
        slab.discard()
        os.rmdir(folder)


def test_a_step_begun_before_stop_writing_is_not_spooled(tmp_path):
    """Zero-code stops writing after a failure; a step it had begun is then not handed over."""
    w = torch.nn.Parameter(torch.randn(4, 3))
    opt = torch.optim.SGD([w], lr=0.1)
    with Recorder(model=None, optimizer=opt, params={"w": w}, store=str(tmp_path / "s")) as rec:
        for step in (1, 2):
            w.sum().backward()
            if step == 2:
                rec.begin_step()
                assert rec._direct is not None
                rec.stop_writing()
                with torch.no_grad():
                    w.sub_(0.1)
                rec.end_step()
            else:
                opt.step()
            opt.zero_grad()
    assert open_store(tmp_path / "s").rank(0).completed_steps == [1]


@pytest.mark.parametrize("full, slab, befores", [((), 3, 1), (("gradients:*",), 1, 1)])
def test_a_capture_whose_slab_and_befores_exceed_the_queue_cap_takes_the_general_path(tmp_path, full, slab, befores):
    """Filling in place keeps memory in the rank (a mapped slab with the kept bytes, the parameters
    before the update): a step whose slab and befores do not fit in the cap is left to the general
    path, which frees its copies at the step's end; one that fits takes its slab under the cap
    less the befores (Handoff.slab waits for room in it). A digested tensor (not named by --full)
    holds only its record."""
    params = [("w", torch.randn(64, 64))]
    grads = [("w", torch.randn(64, 64))]
    # all kept: the slab's gradients, parameters and deltas of w; gradients only: the slab's
    # gradients (+ 2 small records); both: the parameters before
    tensor = 64 * 64 * 4
    nbytes = (slab + befores) * tensor + (0 if not full else 2 * DIGEST_RECORD)
    for cap, direct in ((nbytes, True), (nbytes - 1, False)):
        handoff = _FakeHandoff(str(tmp_path / str(cap)), max_bytes=cap)
        os.makedirs(handoff.folder)
        buffers = {}
        got = DirectCapture.begin(handoff, 1, {}, grads, params, True, True, buffers, parse_full(full))
        assert (got is not None) == direct
        assert handoff.made == int(direct) and (buffers == {}) != direct  # nothing taken when it declines
        assert handoff.budgets == ([cap - befores * tensor] if direct else [])


def test_a_slab_is_taken_only_once_the_entries_in_flight_leave_room_for_it(tmp_path, monkeypatch):
    """With a slow writer and a cap that holds one slab beside the befores, every step waits for
    the last one's slab instead of making a second: the slabs in flight (each in the rank's RSS
    once reused) stay within the cap. The store holds every step bit for bit."""
    monkeypatch.setenv("TRACEKIT_WRITE_MBPS", "1")  # a slow disk, in the writer process: ~50 ms an entry
    create_store(str(tmp_path / "s"), {})
    tensor = 64 * 64 * 4
    handoff = Handoff(str(tmp_path / "s"), 0, {"coords": {"rank": 0}}, max_bytes=4 * tensor + 4096)
    torch.manual_seed(0)
    w = torch.randn(64, 64)
    buffers, expected = {}, []
    try:
        for step in range(1, 6):
            grad = torch.randn(64, 64)
            cap = DirectCapture.begin(handoff, step, {}, [("w", grad)], [("w", w)], True, True, buffers)
            assert cap is not None
            before = w.clone()
            w.sub_(0.1 * grad)
            assert cap.capture({}, {"w": w})
            handoff.seal()
            expected.append((grad.clone(), w.clone(), w - before))
        assert handoff._slabs_made == 1  # a second does not fit beside the one in flight and the befores
    finally:
        handoff.close("finished")
    rank = open_store(tmp_path / "s").rank(0)
    assert rank.completed_steps == [1, 2, 3, 4, 5]
    for step, (grad, param, delta) in enumerate(expected, 1):
        for kind, want in (("gradients", grad), ("parameters", param), ("deltas", delta)):
            assert np.array_equal(rank.read(kind, step, "w"), want.numpy()), (kind, step)


def _record_steps(store, full, dtype, late_observe_at=None):
    """Three steps of a hand-written update of a 72,000-element matrix (over one summaries.BLOCK), a
    vector, and a frozen vector (its delta zero, its bytes unchanged); returns the recorder's
    counts of slabs made and steps the direct capture took."""
    torch.manual_seed(0)
    params = {"a": torch.nn.Parameter(torch.randn(300, 240).to(dtype)), "b": torch.nn.Parameter(torch.randn(240).to(dtype)),
              "frozen": torch.nn.Parameter(torch.randn(5).to(dtype))}
    rec = Recorder(params=params, config=RecordConfig(store=store, full=full)).start()
    direct_steps = 0
    try:
        for step in (1, 2, 3):
            x = torch.randn(300, generator=torch.Generator().manual_seed(step)).to(dtype)
            out = torch.tanh(x @ params["a"] + params["b"]) * params["frozen"].sum()
            out.sum().backward()
            if step != late_observe_at:
                rec.observe(output=out.detach(), loss=out.sum().detach())
            rec.begin_step()
            direct_steps += rec._direct is not None
            with torch.no_grad():
                for name, p in params.items():
                    if name != "frozen":
                        p.sub_(0.1 * p.grad)
                    p.grad = None
            if step == late_observe_at:  # staged after begin_step: the step falls back to the general path
                rec.observe(output=out.detach(), loss=out.sum().detach())
            rec.end_step()
        made = rec._handoff._slabs_made
    finally:
        rec.close()
    return made, direct_steps


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("late_observe_at", [None, 2])
def test_tensors_digested_on_the_rank_have_the_hashes_and_summaries_the_writer_gives(tmp_path, monkeypatch, dtype,
                                                                                     late_observe_at):
    """Tensors --full does not name are hashed and summarized in the rank and sent as records (no
    bytes), by the direct capture and by the general path: the store holds the very hashes and
    summaries the writer computes from bytes (a store keeping every tensor), also for a step that
    falls back to the general path after its gradients were digested, and for a frozen tensor
    hashed first."""
    full = ("gradients:a", "outputs:*")  # keep these; digest the rest (gradient b, parameters, deltas, loss)
    made, direct_steps = _record_steps(str(tmp_path / "direct"), full, dtype, late_observe_at)
    assert made >= 1 and direct_steps == 3
    _record_steps(str(tmp_path / "kept"), (), dtype, late_observe_at)
    entries = []  # the general path's spool entries: (kind, name, bytes that travel)
    real_write_entry = handoff_module.write_entry

    def spy(path, step, complete, tensors, extra=None):
        entries.append([(kind, t.name, t.data.nbytes) for kind, t in tensors])
        return real_write_entry(path, step, complete, tensors, extra)

    with monkeypatch.context() as m:  # the general path digests them too, before they are spooled
        m.setattr(DirectCapture, "begin", classmethod(lambda cls, *a, **k: None))
        m.setattr(handoff_module, "write_entry", spy)
        assert _record_steps(str(tmp_path / "general"), full, dtype, late_observe_at) == (0, 0)
    travelled = {(kind, name) for entry in entries for kind, name, nbytes in entry if nbytes}
    assert travelled == {("gradients", "a"), ("outputs", "output")}
    direct, general, kept = (open_store(tmp_path / n).rank(0) for n in ("direct", "general", "kept"))
    for kind in ("gradients", "parameters", "deltas", "loss", "outputs"):
        for step in (1, 2, 3):
            want = kept.summaries(kind, step)  # computed by the writer process from the bytes
            for other in (direct, general):
                got = other.summaries(kind, step)
                assert got.keys() == want.keys() and all(got[n].tobytes() == want[n].tobytes() for n in want), (kind, step)
            assert direct.digests(kind, step) == general.digests(kind, step) == kept.digests(kind, step), (kind, step)
    assert np.array_equal(direct.read_bits("gradients", 2, "a"), kept.read_bits("gradients", 2, "a"))
    with pytest.raises(Exception, match="summar|bytes|full"):
        direct.read_bits("parameters", 2, "a")  # digested: no bytes were kept
    zero = direct.summaries("deltas", 3)["frozen"]
    assert (zero[0], zero[1], zero[3]) == (0.0, 0.0, 0.0)  # the frozen vector's delta, from its digest
