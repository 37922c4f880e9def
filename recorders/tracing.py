"""Op- and module-level traces of chosen steps (`tracekit record --trace ops|modules`).

ops: a TorchDispatchMode sees every aten op this rank dispatches while the step runs: forward,
backward (the autograd engine dispatches in the same thread-local state), the optimizer's update
and the c10d collectives. Each op becomes one event with its non-tensor arguments (scalars such as
`alpha`, dims, dtypes), and for each input and output tensor its shape, dtype, device,
summaries (min, max, mean, L2, NaN and Inf counts), an xxh3-64 hash of its bytes, and the event that
produced it (the data flow the root-cause search follows).

modules: forward hooks on the model's modules record each module's output, and a hook on each of
its inputs that needs a gradient records, in backward, the gradient its backward computed for it
(a module whose inputs need none, such as the first layer, has no backward event). Only the
traced steps pay: hooks and the mode are installed at the start of the step and removed at its end.

We write our own mode rather than use torch.utils._debug_mode.DebugMode (torch 2.13): DebugMode
logs op strings with a norm or hash per tensor, but not float64 summaries, the producer of each
input, or scalar arguments as values we can compare, which the root-cause search needs.

Why the module path in backward comes from sequence numbers: an op runs below autograd, so its
grad_fn does not exist yet when the mode sees it; the autograd node created for it has already
taken the thread's sequence number, though, and in backward the engine's current node carries it.
"""

from __future__ import annotations

import ctypes
import fnmatch
import functools
import math
import os
import re
import sys
import weakref
from contextlib import contextmanager

import torch
import xxhash
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten

from tracekit.recorders.materialize import canonical_name
from tracekit.store.kinds import TRACE_LEVELS
from tracekit.store.trace_events import annotate, event_record, tensor_record

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_OWN_DIRS = tuple(os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep + d for d in ("tracekit", "recorders"))
_OWN_DIRS += (os.path.dirname(os.path.abspath(__file__)) + os.sep,)
_COLLECTIVE_NAMESPACES = ("c10d.", "_c10d_functional.", "c10d_functional.", "_dtensor.")
# functional collectives' waits: once one returns, the tensor it waited on holds the collective's
# final values. And the autograd wrapper funcol puts around an output still in flight: neither
# computes anything, nor is a collective of its own
_WAITS = frozenset(("_c10d_functional.wait_tensor.default", "c10d_functional.wait_tensor.default"))
_WRAPS = frozenset(("_c10d_functional._wrap_tensor_autograd.default",))
# ops whose output shows exactly the input's values under another shape or strides: its summary
# and hash are the input's (the output is a function of the input alone), so none is computed
_RELABEL = frozenset(f"aten.{n}" for n in (
    "t.default", "transpose.int", "permute.default", "view.default", "_unsafe_view.default", "reshape.default",
    "detach.default", "alias.default", "squeeze.dim", "squeeze.default", "unsqueeze.default", "view_as.default",
    "_reshape_alias.default", "numpy_T.default", "clone.default", "contiguous.default"))
# ops whose outputs hold uninitialized memory: their values mean nothing and are never compared
_UNINITIALIZED = ("aten.empty", "aten.new_empty", "aten.empty_like", "aten.empty_strided", "aten.new_empty_strided")


def _plain_dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _hash(x: torch.Tensor, flat: torch.Tensor | None = None) -> str:
    """flat: x's elements in memory order (see _memory_order), when x is dense but permuted: its
    bytes are hashed in place, under a name carrying the layout, so only tensors of one layout are
    ever called bitwise equal (a copy to logical order cost ~240 us for 400 KB, profiled)."""
    name = "xxh3_64"
    if x.is_contiguous():
        c = x
    elif flat is not None:
        c = flat
        name = "xxh3_64@" + ",".join(map(str, _order(x)))
    else:
        c = x.contiguous()
    if c.device.type != "cpu":
        c = c.cpu()
    nbytes = c.numel() * c.element_size()
    if nbytes == 0:
        return _EMPTY_HASH
    # the bytes in place, through ctypes: .numpy() would mark the storage non-resizable, and FSDP2
    # frees its unsharded parameters by resizing their storage to 0. xxh3-64, not a cryptographic
    # hash: it only tells equal bytes from unequal ones. zlib's CRC-32, used before, took ~700 us
    # for a 400 KB tensor here, xxh3-64 ~8 us: the hash was the traced step's largest single cost
    raw = (ctypes.c_ubyte * nbytes).from_address(c.data_ptr())
    return f"{name}:{xxhash.xxh3_64_intdigest(raw):016x}"  # named: traces hashed otherwise are never called equal


def _order(x: torch.Tensor) -> list[int]:
    """x's dims from the outermost in memory to the innermost."""
    return sorted(range(x.dim()), key=lambda d: (-x.stride(d), d))


def _memory_order(x: torch.Tensor) -> torch.Tensor | None:
    """A 1-D view of x's elements as they lie in memory, when x is a permutation of a dense block
    (a transposed weight or gradient): summaries (min, max, sum, norm) do not depend on element
    order, and strided reductions over a transpose took ~4x as long (profiled). None otherwise."""
    if x.is_contiguous():
        return None
    expected = 1
    for d in reversed(_order(x)):  # innermost first: each stride the product of the sizes inside it
        if x.size(d) != 1 and x.stride(d) != expected:
            return None
        expected *= x.size(d)
    return x.as_strided((x.numel(),), (1,))


_EMPTY_HASH = f"xxh3_64:{xxhash.xxh3_64_intdigest(b''):016x}"


def summarize(t: torch.Tensor) -> dict:
    """Shape, dtype, device, summaries [min, max, mean, l2, nan, inf] and a hash of one tensor."""
    x = t  # no detach: the summaries run with grad off, and each detach is one more dispatch
    shape, dtype, device = list(x.shape), _plain_dtype(x.dtype), str(x.device)
    if is_traceable_wrapper_subclass(x):
        # a DTensor (or other wrapper): any op on it here would dispatch to the subclass, maybe a
        # collective. Its local tensors show up in the ops the subclass runs next.
        return tensor_record(shape, dtype, device, None, None, subclass=type(x).__name__)
    if x.layout != torch.strided or x.is_complex() or x.is_quantized or x.device.type == "meta":
        return tensor_record(shape, dtype, device, None, None)
    n = x.numel()
    if n == 0:
        return tensor_record(shape, dtype, device, None, _hash(x))
    # grad mode off by hand: torch.no_grad() as a decorator or context cost ~30 us a tensor
    grad = torch.is_grad_enabled()
    torch._C._set_grad_enabled(False)
    try:
        flat = _memory_order(x)
        stats = _stats(x if flat is None else flat, n)
    finally:
        torch._C._set_grad_enabled(grad)
    return tensor_record(shape, dtype, device, stats, _hash(x, flat))


def _stats(x: torch.Tensor, n: int) -> list:
    # reductions in the tensor's own precision (16-bit floats in float32): vectorized, where a
    # float64 accumulation of float32 data takes a slow casting path (~100x, measured on CPU);
    # equal tensors still get equal summaries, and the hash decides bitwise equality
    if x.dtype in (torch.float32, torch.float64):
        v = x
    elif x.is_floating_point():
        v = x.float()
    else:
        v = x.to(torch.float64)
    if n >= 4096:  # two passes beat aminmax's one on large CPU tensors here (21 vs 32 us at 100K)
        lo, hi = torch.amin(v), torch.amax(v)
    else:
        lo, hi = torch.aminmax(v)
    parts = (lo, hi, torch.sum(v), torch.linalg.vector_norm(v))
    if v.device.type == "cpu":  # no device to wait for: four reads beat a stack and a list
        mn, mx, s, norm = (p.item() for p in parts)
    else:  # one host sync per tensor
        mn, mx, s, norm = torch.stack(parts).tolist()
    nan = inf = 0
    if not (math.isfinite(s) and math.isfinite(norm)):  # a finite sum and norm rule both out
        nan, inf = int(torch.isnan(v).sum()), int(torch.isinf(v).sum())
    return [mn, mx, s / n, norm, nan, inf]


@functools.lru_cache(maxsize=4096)
def _short(path: str) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return path


def _user_line() -> str | None:
    """file:line of the innermost frame outside torch and tracekit (the user's code), cheaply."""
    return _site()[1]


_GRAPH_CODE = "<eval_with_key>"
_FQN_ROOT = re.compile(r"^L\['[^']*'\]\.?")
_FQN_PART = re.compile(r"\[['\"]?([^'\"\]]+)['\"]?\]")
_NODE_SITES: dict = {}  # (graph code file, line) -> (module path relative to the compiled root, src)


_INTERNAL, _GRAPH, _USER, _INDUCTOR = 0, 1, 2, 3
_CODE_KINDS: dict = {}  # code object -> _INTERNAL, _GRAPH, _USER or _INDUCTOR (one string test per code, not per op)
_USER_SITES: dict = {}  # (code object, line) -> "file:line"


@functools.lru_cache(maxsize=1)
def _inductor_dir() -> str:
    """Where inductor writes the Python code it generates (its kernels' callers): the same rule as
    torch._inductor.runtime.cache_dir_utils.cache_dir, without importing inductor."""
    import getpass
    import tempfile

    d = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not d:
        try:
            user = getpass.getuser()
        except Exception:
            user = "unknown"
        d = os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r"[\\/:*?\"<>|]", "_", user))
    return os.path.abspath(d) + os.sep


def _code_kind(code) -> int:
    name = code.co_filename
    if name.startswith(_GRAPH_CODE):
        kind = _GRAPH
    elif name.startswith(_TORCH_DIR) or name.startswith(_OWN_DIRS) or name.startswith("<"):
        kind = _INTERNAL
    elif name.startswith(_inductor_dir()):
        kind = _INDUCTOR
    else:
        kind = _USER
    _CODE_KINDS[code] = kind
    return kind


def _site():
    """(module, src, compiled) of the running op. Inside an aot_eager graph (fx GraphModules run
    as Python code), module is the path from the graph node's nn_module_stack, relative to the
    compiled root; else module is None and src the user's innermost frame outside torch and
    tracekit. compiled is "inductor" when inductor's generated code called the op (an extern
    kernel or fallback): its module path is unknown, and what its own kernels computed is unseen."""
    f = sys._getframe(3)
    kinds = _CODE_KINDS
    compiled = None
    while f is not None:
        code = f.f_code
        kind = kinds.get(code)
        if kind is None:
            kind = _code_kind(code)
        if kind == _INTERNAL or kind == _INDUCTOR:
            if kind == _INDUCTOR:
                compiled = "inductor"
            f = f.f_back
            continue
        key = (code, f.f_lineno)
        if kind == _GRAPH:
            hit = _NODE_SITES.get((code.co_filename, key[1]))
            if hit is None:
                hit = _NODE_SITES[(code.co_filename, key[1])] = _graph_node_site(f)
            return hit[0], hit[1], compiled
        src = _USER_SITES.get(key)
        if src is None:
            src = _USER_SITES[key] = f"{_short(code.co_filename)}:{key[1]}"
        return None, src, compiled
    return None, None, compiled


def _graph_node_site(frame) -> tuple[str, str | None]:
    import linecache

    gm = frame.f_locals.get("self")
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    target = line.strip().split(" = ", 1)[0].split(",")[0].strip()
    node = None
    graph = getattr(gm, "graph", None)
    if graph is not None and target:
        node = next((n for n in graph.nodes if n.name == target), None)
    if node is None:
        return "", None
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}
    path = ""
    if stack:
        fqn = list(stack.values())[-1][0]
        path = canonical_name(_FQN_PART.sub(r".\1", _FQN_ROOT.sub("", fqn)).strip(".")) if fqn else ""
    src = None
    trace = node.meta.get("stack_trace") or ""
    m = re.findall(r'File "([^"]+)", line (\d+)', trace)
    if m:
        src = f"{_short(m[-1][0])}:{m[-1][1]}"
    return path, src


def _group_ranks(value) -> list[int] | None:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        if isinstance(value, str):  # functional collectives name their group
            from torch.distributed.distributed_c10d import _resolve_process_group

            value = _resolve_process_group(value)
        elif "ScriptObject" in type(value).__name__:  # c10d ops carry the group boxed
            value = dist.ProcessGroup.unbox(value)
        return list(dist.get_process_group_ranks(value))
    except Exception:
        return None


class _Encoder:
    """Turns an op's arguments into JSON: tensors become {"t": k} (k-th input), the rest values."""

    def __init__(self, summarize_input, collective: bool):
        self.summarize_input = summarize_input
        self.collective = collective
        self.inputs: list[dict] = []
        self.group: list[int] | None = None

    def __call__(self, v):
        if isinstance(v, torch.Tensor):
            self.inputs.append(self.summarize_input(v))
            return {"t": len(self.inputs) - 1}
        if v is None or isinstance(v, (bool, int, str)):
            if self.collective and isinstance(v, str) and self.group is None:
                self.group = _group_ranks(v)
            return v
        if isinstance(v, float):
            return v if math.isfinite(v) else {"float": repr(v)}
        if isinstance(v, (list, tuple)):
            return [self(x) for x in v]
        if isinstance(v, torch.device):
            return {"device": str(v)}  # compared as equal across devices
        if isinstance(v, torch.dtype):
            return {"dtype": _plain_dtype(v)}
        if isinstance(v, (torch.layout, torch.memory_format)):
            return str(v)
        if isinstance(v, complex):
            return {"complex": repr(v)}
        if "ProcessGroup" in type(v).__name__ or (self.collective and "ScriptObject" in type(v).__name__):
            ranks = _group_ranks(v)
            if ranks is not None:
                self.group = ranks
                return {"group": ranks}
        return {"object": type(v).__name__}


def _local_of(t: torch.Tensor) -> torch.Tensor | None:
    """A DTensor's local shard, when it is a plain tensor: reading it runs no collective (ops on the
    DTensor itself could), and the subclass's local ops, which write it, run unseen by the mode."""
    local = getattr(t, "_local_tensor", None) if type(t).__name__ == "DTensor" else None
    if isinstance(local, torch.Tensor) and not is_traceable_wrapper_subclass(local):
        return local
    return None


def _as_local(s: dict, t: torch.Tensor) -> dict:
    """A shard's summary as a DTensor's: shape is the shard's (other shardings never pair up)."""
    return annotate(dict(s), subclass=type(t).__name__, local=True, global_shape=list(t.shape))


def _pending(t: torch.Tensor) -> dict:
    """What a trace shows of memory a collective is still writing: no values."""
    return tensor_record(list(t.shape), _plain_dtype(t.dtype), str(t.device), None, None, pending=True)


def _work_of(result):
    """The c10d Work a c10d op returned (boxed), or None (functional collectives return none)."""
    for v in tree_flatten(result)[0]:
        if "ScriptObject" in type(v).__name__:
            try:
                import torch.distributed as dist

                return dist.distributed_c10d.Work.unbox(v)
            except Exception:
                return None
    return None


def _completed(work) -> bool:
    try:
        return bool(work.is_completed())
    except Exception:
        return False


def _written_args(info: "_OpInfo", args, kwargs) -> list[torch.Tensor]:
    """The tensors an in-place or out= op writes (its schema's written arguments)."""
    out = []
    for pos, name in info.writes:
        arg = args[pos] if pos < len(args) else (kwargs.get(name) if kwargs else None)
        out += [w for w in (arg if isinstance(arg, (list, tuple)) else (arg,)) if isinstance(w, torch.Tensor)]
    return out


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """[first byte, end byte) of the memory t's elements span."""
    lo = t.data_ptr()
    if t.numel() == 0:
        return lo, lo
    span = 1 + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()))
    return lo, lo + span * t.element_size()


def _forget(info: dict, key: int, entry: list, _ref) -> None:
    if info.get(key) is entry:
        del info[key]


class StepTrace:
    """One traced step of one rank: the events, and the full tensors asked for with --trace-full."""

    def __init__(self, level: str, step: int, full_globs: tuple[str, ...]):
        self.level = level
        self.step = step
        self.full_globs = full_globs
        self.events: list[dict] = []
        self.full: list[tuple[str, torch.Tensor]] = []
        self._calls: dict[tuple, int] = {}
        # per live tensor, one entry: [version, summary of that version (unchanged inputs are
        # summarized once), (producing event, output position), name, weakref, (version, key) of
        # its bytes kept for --trace-full (an input read at that version refers to them, no second
        # copy)]. Keyed by id(),
        # the entry leaving with the tensor (the weakref's callback): a plain dict lookup, where
        # torch's WeakTensorKeyDictionary built a key object per lookup (~10 us, profiled)
        self._info: dict[int, list] = {}
        # memory a collective is still writing: storage address -> its c10d Work (done when
        # is_completed() says so), or None for a functional collective's output (done at its
        # wait_tensor). What lies there is never summarized, hashed or kept: it reads `pending`
        self._inflight: dict[int, object] = {}
        # where in-place and out= ops wrote: storage address -> [(first byte, end byte, event,
        # output position)], in execution order
        self._written: dict[int, list] = {}
        self._inductor = False  # the op being recorded was called from inductor's generated code

    def _entry(self, t: torch.Tensor) -> list:
        e = self._info.get(id(t))
        if e is None:
            e = [None, None, None, None, None, None]
            e[4] = weakref.ref(t, functools.partial(_forget, self._info, id(t), e))
            self._info[id(t)] = e
        return e

    def name_tensor(self, t: torch.Tensor, name: str) -> None:
        e = self._entry(getattr(t, "_local_tensor", t))
        e[3] = name
        if e[2] is not None and e[2][1] is not None:  # the event that computed it: the chain's end names the step-level tensor
            annotate(self.events[e[2][0]]["outputs"][e[2][1]], name=name)

    def _summary(self, t: torch.Tensor, fresh: bool = False) -> dict:
        # fresh: an op's output. An in-place op's version bump happens above this mode, after the
        # op returns, so the cached entry of its output would still look current.
        local = _local_of(t)
        if local is not None:  # a DTensor: its shard's numbers, with the shard's producer and name
            return _as_local(self._summary(local, fresh), t)
        e = self._entry(t)
        if self._inflight and self._in_flight(t):
            e[0] = e[1] = e[5] = None  # whatever was summarized of it before is stale once it lands
            s = _pending(t)
            if e[2] is not None:
                annotate(s, producer=list(e[2]))
            return s
        version = t._version
        if fresh or e[0] != version or e[1] is None:
            old = e[1]
            e[0], e[1] = version, summarize(t)
            written = self._last_write(t) if self._written and not fresh else None
            if written is not None and (e[2] is None or written[0] > e[2][0]):
                # written since its producer through another tensor on its memory (a view, an
                # out= buffer): that write made the values readers see from here on
                e[2] = written
            elif self._inductor and not fresh and old is not None and e[2] is not None and old.get("hash") != e[1]["hash"]:
                # read by inductor's code and changed since the event that produced it, by a write
                # the mode never saw (inductor's kernels work in place on its buffers): that event
                # is no longer its producer. Only there: in eager code every write is an op the
                # mode sees, and a view's bytes also change with its base's
                e[2] = None
                annotate(e[1], unseen_write=True)
        s = dict(e[1])
        if e[2] is not None:
            annotate(s, producer=list(e[2]))
        if e[3] is not None:
            annotate(s, name=e[3])
        return s

    def _in_flight(self, t: torch.Tensor) -> bool:
        """Whether a collective may still be writing t's memory."""
        if is_traceable_wrapper_subclass(t) or t.device.type == "meta":
            return False
        key = t.untyped_storage().data_ptr()
        if key not in self._inflight:
            return False
        work = self._inflight[key]
        if work is not None and _completed(work):
            del self._inflight[key]
            return False
        return True

    def _launched(self, outs, result) -> None:
        """A collective returned: its outputs are in flight until its work completes (c10d ops,
        which return their Work) or until a wait_tensor on them (functional collectives)."""
        work = _work_of(result)
        for o in outs:
            if not is_traceable_wrapper_subclass(o) and o.device.type != "meta" and o.untyped_storage().data_ptr():
                self._inflight[o.untyped_storage().data_ptr()] = work

    def _landed(self, tensors) -> None:
        for t in tensors:
            if isinstance(t, torch.Tensor) and not is_traceable_wrapper_subclass(t) and t.device.type != "meta":
                self._inflight.pop(t.untyped_storage().data_ptr(), None)

    def _wrote(self, info: "_OpInfo", index: int, args, kwargs, outs) -> None:
        """Remember where an in-place or out= op wrote: readers of other tensors on that memory
        (the base of a view it wrote through) take it as their producer."""
        for w in _written_args(info, args, kwargs):
            if is_traceable_wrapper_subclass(w) or w.device.type == "meta":
                continue
            k = next((j for j, o in enumerate(outs) if o is w), None)
            lo, hi = _extent(w)
            self._written.setdefault(w.untyped_storage().data_ptr(), []).append((lo, hi, index, k))

    def _last_write(self, t: torch.Tensor) -> tuple | None:
        """(event, output position or None) of the latest seen write overlapping t's memory."""
        if is_traceable_wrapper_subclass(t) or t.device.type == "meta":
            return None
        writes = self._written.get(t.untyped_storage().data_ptr())
        if not writes:
            return None
        lo, hi = _extent(t)
        for wlo, whi, index, k in reversed(writes):
            if wlo < hi and lo < whi:
                return (index, k)
        return None

    def wants_full(self, label: str) -> bool:
        return any(fnmatch.fnmatchcase(label, g) for g in self.full_globs)

    def add(self, phase: str, module: str, op: str, args, kwargs, run, src: str | None, view: bool = False,
            info: "_OpInfo | None" = None, compiled: str | None = None) -> object:
        """Record one call: summarize the inputs, run it, summarize the outputs; returns its result."""
        if info is None:
            info = _OpInfo.of_name(op, view)
        key = (phase, module, op)
        call = self._calls.get(key, 0)
        self._calls[key] = call + 1
        index = len(self.events)
        collective = info.collective
        enc = _Encoder(self._summary, collective)
        self._inductor = compiled == "inductor"
        enc_args = [enc(a) for a in args]
        # an out= argument's values before the op are never read (often uninitialized): not an input
        enc_kwargs = {k: ({"out": True} if k in info.out_args else enc(v)) for k, v in kwargs.items()} if kwargs else {}
        full = bool(self.full_globs) and self.wants_full(f"{phase}:{module}:{op}#{call}")
        if full:  # inputs before the op: an in-place op overwrites them (out= buffers are no inputs)
            read = {k: v for k, v in kwargs.items() if k not in info.out_args} if kwargs else {}
            in_tensors = [a for a in tree_flatten((args, read))[0] if isinstance(a, torch.Tensor)]
            self._keep(index, "in", in_tensors, enc.inputs)
        result = run()
        if info.waits:  # the collective's values are final from here on
            self._landed(args)
        elif info.writes and self._inflight and not collective:
            # an op wrote over a collective's output: the program waited for it first (else its
            # write would race the collective's), so what lies there now is final
            self._landed(_written_args(info, args, kwargs))
        if isinstance(result, torch.Tensor):  # most ops: no pytree walk
            outs = [result]
        elif isinstance(result, (tuple, list)) and all(isinstance(x, torch.Tensor) for x in result):
            outs = list(result)
        else:
            outs = [x for x in tree_flatten(result)[0] if isinstance(x, torch.Tensor)]
        outputs = []
        # a view of uninitialized memory (as_strided windows of an `empty` buffer) is uninitialized too
        uninitialized = info.uninitialized or (info.view and any(i.get("uninitialized") for i in enc.inputs))
        relabel = info.relabel and len(outs) == 1 and len(enc.inputs) >= 1 and "subclass" not in enc.inputs[0]
        for k, o in enumerate(outs):
            if relabel:
                shown = enc.inputs[0]
                flag = "pending" if shown.get("pending") else "uninitialized" if shown.get("uninitialized") else None
                s = tensor_record(list(o.shape), shown["dtype"], shown["device"], shown.get("stats"), shown.get("hash"),
                                  **({flag: True} if flag else {}))
                entry = self._entry(o)
                entry[0], entry[1] = o._version, s
            elif collective or uninitialized:
                # the collective may still be in flight (async work): no values yet; its consumers
                # summarize what arrived once they run
                s = tensor_record(list(o.shape), _plain_dtype(o.dtype), str(o.device), None, None,
                                  **{"uninitialized" if uninitialized else "pending": True})
                entry = self._entry(o)
                # uninitialized: what a read shows until a seen write bumps its version (its bytes
                # are garbage, and summarizing them made two clean runs look different). Not under
                # inductor, whose kernels fill its buffers unseen. A collective's tensors: its next
                # reader summarizes what arrived (it may write in flight, without a version bump)
                entry[0], entry[1] = (o._version, s) if uninitialized and not self._inductor else (None, None)
            elif _local_of(o) is not None:  # a DTensor: its shard (written by the subclass's local op, unseen)
                local = _local_of(o)
                s = _as_local(self._summary(local, fresh=True), o)
                annotate(s, producer=None)
                entry = self._entry(local)
            elif self._inflight and self._in_flight(o):  # funcol's wrapper of an output in flight
                s = _pending(o)
                entry = self._entry(o)
                entry[0] = entry[1] = None
            else:
                entry = self._entry(o)
                entry[0], entry[1] = o._version, summarize(o)
                s = dict(entry[1])
                if entry[3] is not None:
                    annotate(s, name=entry[3])
            outputs.append(s)
            # a wait or wrapper passes the collective's values on: readers after it pair their
            # inputs with the collective itself (which a differing result then blames)
            passed = enc.inputs[0].get("producer") if info.passes_on and enc.inputs else None
            entry[2] = tuple(passed) if passed else (index, k)
        if info.writes and not collective:
            self._wrote(info, index, args, kwargs, outs)
        if full and not collective:
            self._keep(index, "out", outs, outputs, remember=not uninitialized)
        if collective:  # it writes its tensors in flight, unseen: no summary or kept copy of them stays current
            self._launched(outs, result)
            for t in tree_flatten((args, kwargs))[0]:
                if isinstance(t, torch.Tensor) and not is_traceable_wrapper_subclass(t):
                    e = self._entry(t)
                    e[0] = e[1] = e[5] = None
        self.events.append(event_record(index, phase, module, op, call, enc_args, enc_kwargs, enc.inputs, outputs,
                                        src, group=enc.group, view=info.view, compiled=compiled))
        return result

    def _keep(self, index: int, side: str, tensors, refs, remember: bool = True) -> None:
        # An input whose bytes were kept at its current version (most inputs are earlier outputs)
        # refers to that copy: half the bytes of `ops+full`. Not under inductor, whose kernels
        # write its buffers in place unseen (see _summary)
        reuse = side == "in" and not self._inductor
        for k, (t, ref) in enumerate(zip(tensors, refs)):
            if t.layout == torch.strided and t.device.type != "meta" and not is_traceable_wrapper_subclass(t):
                e = self._entry(t)
                if reuse and e[5] is not None and e[5][0] == t._version:
                    annotate(ref, full=e[5][1])
                    continue
                key = f"{index}.{side}{k}"
                annotate(ref, full=key)
                # an in-place op's output is recorded before its version bump: a later read sees
                # another version and keeps its own copy
                if remember:  # (not uninitialized memory, which an unseen write may fill)
                    e[5] = (t._version, key)
                self.full.append((key, t.detach().to("cpu", copy=True)))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for _, t in self.full) + 256 * len(self.events)


class _OpInfo:
    """What the trace needs to know of an op, worked out once per op (not once per call)."""

    __slots__ = ("name", "view", "collective", "uninitialized", "relabel", "func", "out_args", "waits", "passes_on", "writes")

    def __init__(self, name: str, view: bool, func=None):
        self.name = name
        try:
            self.out_args = frozenset(a.name for a in func._schema.arguments if a.is_out) if func is not None else frozenset()
        except Exception:
            self.out_args = frozenset()
        try:  # (position, name) of each argument the op writes (in-place ops' self, out= buffers)
            self.writes = tuple((i, a.name) for i, a in enumerate(func._schema.arguments)
                                if a.alias_info is not None and a.alias_info.is_write) if func is not None else ()
        except Exception:
            self.writes = ()
        self.view = view
        self.waits = name in _WAITS
        self.passes_on = self.waits or name in _WRAPS
        self.collective = name.startswith(_COLLECTIVE_NAMESPACES) and not self.passes_on
        self.uninitialized = name.startswith(_UNINITIALIZED)
        self.relabel = name in _RELABEL
        self.func = func  # held: the cache is keyed by its id()

    @staticmethod
    def of_name(name: str, view: bool = False) -> "_OpInfo":
        return _OpInfo(name, view)


_OPS: dict[int, _OpInfo] = {}  # id(OpOverload) -> its info (an OpOverload's own __hash__ is Python code)


def _op_info(func) -> _OpInfo:
    info = _OPS.get(id(func))
    if info is None:
        info = _OPS[id(func)] = _OpInfo(str(func), _is_view(func), func)
    return info


def _is_view(func) -> bool:
    """Whether the op returns a view of an input (as_strided, slice, view, ...): it computes
    nothing, and may show memory its input's summary never covered (a window of a larger buffer)."""
    try:
        return any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)
    except Exception:
        return False


class _OpMode(TorchDispatchMode):
    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Without this, dynamo refuses to compile while the mode is active and the traced step
        # would run eagerly: not the code the user runs. With it, compiled code runs and the mode
        # sees the ops that code dispatches at run time (all of them under aot_eager; under
        # inductor only the ops its kernels fall back to).
        return True

    def __init__(self, tracer: "Tracer"):
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tr = self.tracer
        trace = tr.current
        if trace is None or tr.paused or func.namespace == "profiler":
            return func(*args, **kwargs)
        phase, module, src, compiled = tr.where()
        info = _op_info(func)
        return trace.add(phase, module, info.name, args, kwargs, lambda: func(*args, **kwargs), src, info=info,
                         compiled=compiled)


class Tracer:
    """Traces the chosen steps of one rank at one level; the recorder starts and stops each step."""

    def __init__(self, level: str, model: torch.nn.Module | None, full_globs: tuple[str, ...] = ()):
        if level not in TRACE_LEVELS:
            raise ValueError(f"unknown trace level {level!r}; use one of {', '.join(TRACE_LEVELS)}")
        self.level = level
        self.model = model
        self.full_globs = full_globs
        self.current: StepTrace | None = None
        self.paused = False
        self.phase = "fwd"
        self._stack: list[str] = []
        self._seq_module: dict[int, tuple[str, str | None]] = {}
        self._handles: list = []
        self._input_hooks: dict[int, tuple] = {}  # id(input) -> (weakref, hook handle): this step's backward events
        self._mode: _OpMode | None = None

    # ---- where an op runs -------------------------------------------------------------------
    def where(self) -> tuple[str, str, str | None, str | None]:
        """(phase, module path, source line, compiled) of the op being dispatched."""
        site, src, compiled = _site()
        if self.phase == "opt":
            return "opt", "", src, compiled
        node = torch._C._current_autograd_node()
        base = self._stack[-1] if self._stack else ""
        if site is not None:  # inside an aot_eager graph: its node knows the module
            module = ".".join(p for p in (base, site) if p)
            return ("bwd" if node is not None else "fwd"), module, src, compiled
        if compiled:  # inductor's code: no graph node to ask; the compiled module's own path
            return ("bwd" if node is not None else "fwd"), base, src, compiled
        if node is not None:
            module, src = self._seq_module.get(node._sequence_nr(), ("", None))
            return "bwd", module, src, compiled
        if torch._C._current_graph_task_id() != -1:
            # backward is running but no node is: the engine's callbacks after the graph (DDP's
            # reducer copying the all-reduced buckets into each .grad). Backward work of no
            # module, not forward (they read `fwd` before)
            return "bwd", "", src, compiled
        module = base
        # the node autograd made for this op (if any) took the latest sequence number: remember
        # where it ran, for its backward (first writer wins: ops with no node see a stale number)
        self._seq_module.setdefault(torch.autograd._get_sequence_nr() - 1, (module, src))
        return "fwd", module, src, compiled

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self, step: int, named_params=()) -> None:
        self.current = StepTrace(self.level, step, self.full_globs)
        self.phase = "fwd"
        self._stack.clear()
        self._seq_module.clear()
        self._input_hooks.clear()
        if not self._handles:
            # kept until close(): re-registering hooks each step would make torch.compile recompile
            self._install_module_hooks()
        for name, p in named_params:  # leaves the trace meets by name: the chain can end at them
            self.current.name_tensor(p, f"param:{name}")
        if self.level == "ops":
            self._mode = _OpMode(self)
            self._mode.__enter__()

    def stop(self) -> StepTrace | None:
        trace, self.current = self.current, None
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
        self._seq_module.clear()
        return trace

    def close(self) -> None:
        """No more steps to trace: remove the module hooks (they cost every forward)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def enter_optimizer(self, named_params) -> None:
        """The update starts: name parameters and gradients so the chain ends at a recorded tensor."""
        if self.current is None:
            return
        self.phase = "opt"
        for name, p in named_params:
            self.current.name_tensor(p, f"param:{name}")
            if p.grad is not None:
                self.current.name_tensor(p.grad, f"grad:{name}")

    @contextmanager
    def untraced(self):
        """tracekit's own work (copies, gathers) inside a traced step is not the model's."""
        old, self.paused = self.paused, True
        try:
            yield
        finally:
            self.paused = old

    # ---- module hooks -------------------------------------------------------------------------
    def _install_module_hooks(self) -> None:
        if self.model is None:
            return
        for name, mod in self.model.named_modules():
            path = canonical_name(name) if name else ""
            self._handles.append(mod.register_forward_pre_hook(self._pre(path)))
            self._handles.append(mod.register_forward_hook(self._post(path), always_call=True))

    def _pre(self, path: str):
        def hook(module, args):
            if torch.compiler.is_compiling():
                return
            self._stack.append(path)
            if self.level == "modules" and self.current is not None and not self.paused:
                # the gradient of a module's inputs is what its own backward computes: its `backward`
                # event. (The gradient of its output is computed by whatever read that output, so
                # a fault in module 1's backward first showed as module 0's)
                src = None
                for t in tree_flatten(args)[0]:
                    if isinstance(t, torch.Tensor) and t.requires_grad:
                        src = src or _user_line()
                        # one event per gradient: a module enclosing this one got the same input,
                        # and the innermost module's backward is the one that computed it
                        old = self._input_hooks.pop(id(t), None)
                        if old is not None and old[0]() is t:
                            old[1].remove()
                        self._input_hooks[id(t)] = (weakref.ref(t), t.register_hook(self._grad_hook(path, src)))
        return hook

    def _post(self, path: str):
        def hook(module, args, output):
            if torch.compiler.is_compiling():
                return
            if self._stack and self._stack[-1] == path:
                self._stack.pop()
            trace = self.current
            if self.level != "modules" or trace is None or self.paused:
                return
            self.paused = True
            try:
                src = _user_line()
                trace.add("fwd", path, "forward", args, {}, lambda: output, src)
            finally:
                self.paused = False
        return hook

    def _grad_hook(self, path: str, src: str | None):
        def hook(grad):
            trace = self.current
            if trace is not None and not self.paused:
                trace.add("bwd", path, "backward", (), {}, lambda: grad, src)
        return hook
