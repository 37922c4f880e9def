"""Proof of no change (issue 37): `tracekit diff --json` on fixed store pairs, byte-equal to the
committed reports in golden/diff/.

Each pair is built in-process (no torchrun) from integers and simple formulas, so its report is the
same on every machine and torch version. The JSON report, the exit status and the stderr lines are
masked (MASKED below: timings and paths only; a mask never hides a count, a verdict or a tensor
name), written as indented JSON and compared byte for byte with golden/diff/<pair>.json.

A change of the diff's report fails here on purpose. When the change is intended, regenerate the
files and review their git diff before committing it:

    TRACEKIT_UPDATE_GOLDEN=1 python -m pytest -q tests/tracekit/compare/test_golden.py
"""

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tracekit.cli.main import main
from tracekit.store import TensorData
from tracekit.store.shards import Shard
from tracekit.testing import tensor_bytes, write_store

GOLDEN = Path(__file__).parent / "golden" / "diff"
UPDATE = os.environ.get("TRACEKIT_UPDATE_GOLDEN") == "1"
f32 = np.float32
STEPS = 3
RUN = {"device": "cpu", "backend": "gloo"}

# Report fields that depend on the machine or the moment, replaced by a placeholder. A path is a
# tuple of keys; "*" matches every element of a list.
MASKED = {
    ("stats", "seconds"): "<seconds>",
    ("ref", "path"): "<ref>",
    ("cand", "path"): "<cand>",
    ("oracle", "path"): "<oracle>",
}
# Floats are written with 10 significant digits: the norms, cosines, margins and fitted z-scores
# are float64 reductions whose last bits follow numpy's summation order (SIMD width, pairwise
# blocks), which may differ between machines and between two read paths that split a tensor into
# other chunks. Every value the pairs plant differs from its reference far above that.
FLOAT_DIGITS = 10


# ---- the runs: data[rank][step][kind][tensor] ----

# Values on a grid of powers of two, exact in float32. w has 768 elements: the diff's structure
# fits (scale, shift) need a few hundred before they call a fault by its shape.
W = (24, 32)


def _grid(shape, period):
    return np.arange(np.prod(shape), dtype=f32).reshape(shape) % f32(period)


def _params(step):
    return {"w": (_grid(W, 37) - f32(18)) / f32(8) - f32(step) / f32(16),
            "b": np.arange(4, dtype=f32) / f32(4) - f32(step) / f32(16)}


def _grads(step):
    return {"w": (_grid(W, 5) + f32(1)) * f32(step) / f32(16),
            "b": np.full(4, f32(step) / f32(8), f32)}


def run(world=2, *, dp=None, scale=None, one_rank=None, nan=None, shift=None, stale=None):
    """A 3-step data-parallel run of `world` ranks (dp: the data-parallel degree, default world).
    Faults on the candidate: scale=(step, factor) multiplies every rank's gradients from that step,
    one_rank=(rank, step) bumps one rank's parameter w at one step (to no step's value),
    nan=(rank, step) puts a NaN in a gradient, shift=(step, offset) adds to every rank's outputs at
    one step, stale=step records the previous step's parameters at that step on every rank."""
    dp = dp or world
    data = {}
    for r in range(world):
        data[r] = {0: {"parameters": _params(0)}}
        for s in range(1, STEPS + 1):
            grads = {k: v * f32(scale[1]) if scale and s >= scale[0] else v for k, v in _grads(s).items()}
            params = _params(s - 1 if stale == s else s)
            if one_rank == (r, s):
                params["w"] = params["w"] + f32(3) / f32(64)  # off the 1/16 grid: equals no other step
            if nan == (r, s):
                grads["w"] = grads["w"].copy()
                grads["w"][5, 7] = np.nan
            # outputs: the rank's data shard (16 rows of the global batch per data-parallel rank)
            out = (_grid((16, 32), 29 + r % dp) - f32(14)) / f32(4) * f32(s)  # centred: a shift is no scale
            if shift and shift[0] == s:
                out = out + f32(shift[1])
            data[r][s] = {"outputs": {"y": out}, "loss": {"loss": f32(1) / f32(s)}, "gradients": grads,
                          "parameters": params, "deltas": {k: _params(s)[k] - _params(s - 1)[k] for k in params}}
    return data


def coords(world, *, tp=1):
    dp = world // tp
    return {r: {"rank": r, "local_rank": r, "world_size": world, "dp_degree": dp, "dp_rank": r // tp,
                "tp_degree": tp, "tp_rank": r % tp} for r in range(world)}


def sharded(data, *, dim, peers_of):
    """`data` with every rank's parameters and gradients replaced by its piece along `dim`
    (torch.chunk style, as DTensor Shard(dim)): fsdp shards dim 0, tp dim 1 (a 1-D tensor: its
    dim 0). peers_of(rank): the ranks whose pieces tile the tensor, in mesh order."""
    out = {}
    for r, steps in data.items():
        peers = peers_of(r)
        i, n = peers.index(r), len(peers)
        out[r] = {}
        for s, kinds in steps.items():
            out[r][s] = dict(kinds)
            for kind in ("parameters", "gradients"):
                if kind not in kinds:
                    continue
                pieces = {}
                for name, arr in kinds[kind].items():
                    axis = min(dim, arr.ndim - 1)
                    per = -(-arr.shape[axis] // n)
                    lo = min(arr.shape[axis], i * per)
                    hi = min(arr.shape[axis], lo + per)
                    part = np.ascontiguousarray(np.take(arr, range(lo, hi), axis=axis))
                    offset = tuple(lo if d == axis else 0 for d in range(arr.ndim))
                    pieces[name] = TensorData(name, "float32", part.shape, part,
                                              Shard(arr.shape, offset, part.shape, tuple(peers)))
                out[r][s][kind] = pieces
    return out


def _events(step, bump=0):
    return [{"index": i, "phase": "fwd", "module": f"layer.{i % 2}", "op": "aten.mm.default", "call": i,
             "args": [{"t": 0}, i * step + (bump if i == 3 else 0)],
             "inputs": [{"shape": [2, 4], "dtype": "float32", "hash": f"xxh3_64:{i + 16 * step:016x}"}],
             "outputs": []} for i in range(6)]


def traces(world, bump=0):
    return {r: {2: {"ops": _events(2, bump), "modules": _events(2)[:2]}} for r in range(world)}


SUMMARIES_ONLY = ("parameters:*", "loss:*")  # gradients, deltas and outputs keep summaries and hashes only


# ---- the stores (each written once, shared by the pairs) and the pairs ----
# Store: write_store's keyword arguments plus "data". Each store costs ~0.2 s of file creation.

def _ddp(version=None, **fault):
    return {"data": run(**fault), "format_version": version}


def _fsdp(version=None, **fault):
    return {"data": sharded(run(**fault), dim=0, peers_of=lambda r: [0, 1]), "format_version": version}


def _tp(version=None, **fault):
    # 2 tensor-parallel ranks (dp=1): parameters and gradients split by column, outputs replicated
    return {"data": sharded(run(2, dp=1, **fault), dim=1, peers_of=lambda r: [0, 1]),
            "coords": coords(2, tp=2), "format_version": version}


def _bf16_outputs():
    """The v4 ddp run with its outputs stored in bfloat16 (their bits: every value is on the grid,
    so exact in bfloat16), as an accelerator records them against a CPU reference."""
    data = run()
    for steps in data.values():
        for kinds in steps.values():
            if "outputs" in kinds:
                kinds["outputs"] = {n: TensorData(n, "bfloat16", a.shape, (a.view(np.uint32) >> 16).astype(np.uint16))
                                    for n, a in kinds["outputs"].items()}
    return {"data": data}


def _truncated():
    """The v4 ddp run stopped after step 2."""
    return {"data": {r: {s: v for s, v in steps.items() if s < 3} for r, steps in run().items()}}


STORES = {
    "v1_ddp": lambda: _ddp(1),
    "v1_ddp_scale": lambda: _ddp(1, scale=(2, 1.25)),
    "v2_ddp": lambda: _ddp(2),
    "v2_ddp_one_rank": lambda: _ddp(2, one_rank=(1, 2)),
    "v2_ddp_nan": lambda: _ddp(2, nan=(0, 2)),
    "v3_fsdp": lambda: _fsdp(3),
    "v3_fsdp_scale": lambda: _fsdp(3, scale=(3, 1.5)),
    "v3_tp": lambda: _tp(3),
    "v3_traced": lambda: {**_ddp(3), "traces": traces(2)},
    "v4_ddp": lambda: _ddp(),
    "v4_ddp_shift": lambda: _ddp(shift=(2, 0.5)),
    "v4_ddp_stale": lambda: _ddp(stale=3),
    "v4_ddp_truncated": _truncated,
    "v4_ddp_bf16_outputs": _bf16_outputs,
    "v4_ddp_shift_damaged": lambda: _ddp(shift=(2, 0.5)),  # its step-2 outputs object cut short below
    "v1_ddp1": lambda: {"data": run(1), "format_version": 1},  # one rank: global alignment's other world size
    "v4_ddp1_scale": lambda: {"data": run(1, scale=(1, 1.25))},
    "v4_fsdp": lambda: _fsdp(),
    "v4_fsdp_one_rank": lambda: _fsdp(one_rank=(0, 3)),
    "v4_tp": lambda: _tp(),
    "v4_tp_one_rank": lambda: _tp(one_rank=(1, 2)),
    "v4_summaries": lambda: {**_ddp(), "full": SUMMARIES_ONLY},
    "v4_summaries_scale": lambda: {**_ddp(scale=(2, 1.25)), "full": SUMMARIES_ONLY},
    "v4_traced": lambda: {**_ddp(), "traces": traces(2)},
    "v4_traced_events": lambda: {**_ddp(one_rank=(1, 3)), "traces": traces(2, bump=1)},
    # The "v4_" stores are written in the current format (5 since the index text, 6 since flat chunk
    # keys); these in 4 and 5.
    "f4_ddp": lambda: _ddp(4),
    "f5_ddp": lambda: _ddp(5),
}

# name -> (ref store, cand store, diff options). A PASS pair compares two format versions of the
# same run, so no store is written twice.
PAIRS = {
    "v1_vs_v2_ddp_pass": ("v1_ddp", "v2_ddp", ["--all-tensors"]),
    "v1_ddp_scale": ("v1_ddp", "v1_ddp_scale", []),
    "v2_ddp_one_rank": ("v2_ddp", "v2_ddp_one_rank", []),
    "v2_ddp_nan": ("v2_ddp", "v2_ddp_nan", []),
    "v3_vs_v4_fsdp_pass": ("v3_fsdp", "v4_fsdp", ["--all-tensors"]),
    "v3_fsdp_scale": ("v3_fsdp", "v3_fsdp_scale", []),
    "v4_ddp_shift": ("v4_ddp", "v4_ddp_shift", []),
    "v4_ddp_stale": ("v4_ddp", "v4_ddp_stale", []),
    "v4_fsdp_one_rank": ("v4_fsdp", "v4_fsdp_one_rank", []),
    "v3_vs_v4_tp_coords_pass": ("v3_tp", "v4_tp", ["--align", "coords", "--all-tensors"]),
    "v4_tp_one_rank": ("v4_tp", "v4_tp_one_rank", ["--align", "coords"]),
    "v1_vs_v4_global_pass": ("v1_ddp1", "v4_ddp", ["--align", "global", "--all-tensors"]),
    "v4_global_scale": ("v4_ddp", "v4_ddp1_scale", ["--align", "global"]),
    "v4_summaries_only_scale": ("v4_summaries", "v4_summaries_scale", ["--all-tensors"]),
    "v3_vs_v4_traced_pass": ("v3_traced", "v4_traced", []),
    "v4_traced_events_differ": ("v4_traced", "v4_traced_events", []),
    "v4_structural_exit2": ("v4_ddp", "v4_ddp_truncated", []),
    "v4_structural_allow_missing": ("v4_ddp", "v4_ddp_truncated", ["--allow-missing"]),
    "v2_oracle_shift": ("v4_ddp", "v4_ddp_shift", ["--oracle", "v2_ddp"]),  # oracle: a store name
    "v4_bf16_outputs_pass": ("v4_ddp", "v4_ddp_bf16_outputs", []),
    "v4_damaged_object_exit2": ("v4_ddp", "v4_ddp_shift_damaged", []),
    "v4_vs_v5_ddp_pass": ("f4_ddp", "f5_ddp", ["--all-tensors"]),
    "v5_vs_v6_ddp_pass": ("f5_ddp", "v4_ddp", ["--all-tensors"]),
}


def damage(store: str) -> None:
    """Cut rank 0's step-2 outputs object (or pack) to half its bytes: unreadable data, exit 2."""
    path, offset, length = tensor_bytes(store, 0, "outputs", 2, "y")
    with open(path, "r+b") as f:
        f.truncate(offset + length // 2)


# ---- masking ----

def _mask(value, tmp: str, path=()):
    """`value` with MASKED's fields replaced, the stores' folder `tmp` written as <tmp> in every
    string (the replay hints name the stores), and floats rounded to FLOAT_DIGITS."""
    for pattern, placeholder in MASKED.items():
        if len(pattern) == len(path) and all(p in ("*", k) for p, k in zip(pattern, path)):
            return placeholder if value is not None else None
    if isinstance(value, dict):
        return {k: _mask(v, tmp, path + (k,)) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v, tmp, path + ("*",)) for v in value]
    if isinstance(value, str):
        return value.replace(tmp, "<tmp>")
    if isinstance(value, float) and math.isfinite(value) and value != 0.0:
        return float(f"{value:.{FLOAT_DIGITS - 1}e}")
    return value


def masked_output(result, tmp: str) -> str:
    """The golden text of one `tracekit diff --json` run: exit status, report and stderr, masked."""
    report = json.loads(result.stdout) if result.stdout.strip() else None
    doc = {"exit_code": result.exit_code, "stderr": _mask(result.stderr.splitlines(), tmp),
           "report": _mask(report, tmp)}
    return json.dumps(doc, indent=1) + "\n"


@pytest.fixture(scope="module")
def stores(shared_once):
    """Every store the pairs use, written once per test run (whichever pytest-xdist worker asks
    first): about 5 s of file creation on the 2-core CI machine."""

    def write_all(root):
        built = {}
        for name, spec in STORES.items():
            args = spec()
            built[name] = write_store(root / name, args.pop("data"), run=RUN, **args)
        damage(built["v4_ddp_shift_damaged"])
        return built

    root, built = shared_once("golden-diff-stores", write_all)
    return str(root), built


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_diff_report_is_byte_equal_to_the_golden_file(stores, name):
    root, built = stores
    ref, cand = (built[side] for side in PAIRS[name][:2])
    options = [built.get(o, o) if prev == "--oracle" else o for prev, o in zip([None, *PAIRS[name][2]], PAIRS[name][2])]
    result = CliRunner().invoke(main, ["diff", ref, cand, "--json", *options])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    got = masked_output(result, root)
    path = GOLDEN / f"{name}.json"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
    assert path.exists(), f"no golden file {path.name}: run with TRACEKIT_UPDATE_GOLDEN=1 and commit it"
    expected = path.read_text()
    assert got == expected, f"{name}: the report differs from {path.name} (TRACEKIT_UPDATE_GOLDEN=1 rewrites it)"


def test_the_golden_pairs_cover_pass_fail_and_unusable_input():
    """The committed files themselves: at least 12 pairs, with PASS, FAIL and exit 2 among them
    (a structural mismatch's report, a damaged store's one Error line), and a mask that left every
    verdict and count in place."""
    docs = {p.stem: json.loads(p.read_text()) for p in GOLDEN.glob("*.json")}
    assert set(docs) == set(PAIRS)
    codes = [d["exit_code"] for d in docs.values()]
    assert len(docs) >= 12 and codes.count(0) >= 3 and codes.count(1) >= 6 and codes.count(2) >= 2
    for d in docs.values():
        report = d["report"]
        if report is None:  # unusable input: no report, one line
            assert d["exit_code"] == 2 and len(d["stderr"]) == 1 and d["stderr"][0].startswith("Error: ")
            continue
        assert report["stats"]["seconds"] == "<seconds>"
        assert isinstance(report["violations"], int) and report["status"] in ("pass", "fail", "error")
