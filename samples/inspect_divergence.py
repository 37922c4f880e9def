"""From `tracekit diff` saying FAIL to the exact step, rank, tensor and element, with xarray.

Run it:  python samples/inspect_divergence.py [--keep DIR]

It first records two tiny 4-rank runs with tracekit's writer API (well under a second, no
torchrun needed): a reference, and a candidate that agrees to the last bit or so everywhere
except for one planted fault: on rank 2 at step 3, one element of the first layer's gradient
comes out half as large as it should (think of a reduction that lost one of its two partial
sums). Then it walks the divergence down the way you would in a notebook: see `inspect()`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

# Run from a checkout without installing: the repository root holds the tracekit package.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tracekit  # noqa: E402
from tracekit.store import RankWriter, TensorData, create_store, finalize_store  # noqa: E402

WORLD = 4  # a 2 x 2 (dp, tp) mesh, as the coordinates show; the model itself is replicated
STEPS = 5
LR = 0.01
FAULT = {"rank": 2, "step": 3, "kind": "gradients", "tensor": "0.weight", "index": (5, 1), "scale": 0.5}


def _batch(step: int, rank: int):
    rng = np.random.default_rng(1000 * step + rank)  # a pure function of (step, rank): same in both runs
    x = rng.standard_normal((16, 8)).astype(np.float32)
    y = rng.standard_normal((16, 4)).astype(np.float32)
    return x, y


def _init_params():
    rng = np.random.default_rng(0)
    return {
        "0.weight": (rng.standard_normal((16, 8)) * 0.3).astype(np.float32),
        "0.bias": np.zeros(16, np.float32),
        "2.weight": (rng.standard_normal((4, 16)) * 0.3).astype(np.float32),
        "2.bias": np.zeros(4, np.float32),
    }


def _forward_backward(p, x, y):
    """Linear(8, 16) -> ReLU -> Linear(16, 4), mean squared error; returns output, loss, gradients."""
    h = x @ p["0.weight"].T + p["0.bias"]
    a = np.maximum(h, 0)
    out = a @ p["2.weight"].T + p["2.bias"]
    diff = out - y
    loss = np.float32((diff ** 2).mean())
    g_out = (2 * diff / diff.size).astype(np.float32)
    g_a = g_out @ p["2.weight"]
    g_h = g_a * (h > 0)
    grads = {"0.weight": g_h.T @ x, "0.bias": g_h.sum(0), "2.weight": g_out.T @ a, "2.bias": g_out.sum(0)}
    return out, loss, {k: v.astype(np.float32) for k, v in grads.items()}


def _tensors(d: dict) -> list[TensorData]:
    return [TensorData(k, "float32", v.shape, np.ascontiguousarray(v, np.float32)) for k, v in d.items()]


def record_run(path: str, device: str, faulty: bool) -> None:
    """One run of WORLD ranks, each its own replica on its own batches; the loss is the global mean."""
    create_store(path, {"command": ["samples/inspect_divergence.py", "--device", device]}, force=True)
    wobble = np.random.default_rng(7)
    writers, params = [], []
    for rank in range(WORLD):
        coords = {"rank": rank, "local_rank": rank, "world_size": WORLD, "dp_degree": 2, "dp_rank": rank // 2,
                  "tp_degree": 2, "tp_rank": rank % 2,
                  "meshes": [{"dim_names": ["dp", "tp"], "shape": [2, 2], "coordinate": [rank // 2, rank % 2]}]}
        writers.append(RankWriter(path, rank, {"coords": coords, "run": {"device": device, "backend": "gloo",
                                                                          "mode": "toy", "world_size": WORLD}}))
        params.append(_init_params())
        writers[rank].write(0, "parameters", _tensors(params[rank]))
    for step in range(1, STEPS + 1):
        results = [_forward_backward(params[rank], *_batch(step, rank)) for rank in range(WORLD)]
        global_loss = np.float32(np.mean([loss for _, loss, _ in results], dtype=np.float32))
        for rank, (out, _local_loss, grads) in enumerate(results):
            if device != "cpu":
                # an accelerator rounds differently: perturb the gradients by about one float32 ulp
                grads = {k: (g * (1 + 6e-8 * wobble.standard_normal(g.shape))).astype(np.float32) for k, g in grads.items()}
            if faulty and (rank, step) == (FAULT["rank"], FAULT["step"]):
                grads[FAULT["tensor"]][FAULT["index"]] *= FAULT["scale"]
            p = params[rank]
            new = {k: (p[k] - LR * grads[k]).astype(np.float32) for k in p}
            w = writers[rank]
            w.write(step, "outputs", _tensors({"output": out}))
            w.write(step, "loss", [TensorData("loss", "float32", (), np.asarray(global_loss, np.float32))])
            w.write(step, "gradients", _tensors(grads))
            w.write(step, "parameters", _tensors(new))
            w.write(step, "deltas", _tensors({k: new[k] - p[k] for k in p}))
            w.complete_step(step)
            params[rank] = new
    for w in writers:
        w.close()
    finalize_store(path, 0)


def make_runs(folder: str) -> tuple[str, str]:
    """Record the reference and the faulty candidate under folder; return their paths."""
    ref, cand = os.path.join(folder, "ref"), os.path.join(folder, "cand")
    record_run(ref, "cpu", faulty=False)
    record_run(cand, "accel", faulty=True)
    return ref, cand


def inspect(ref: str, cand: str) -> dict:
    """The walk: verdict -> step and rank -> tensor -> element -> the two values."""
    # 1. The verdict: the same engine and the same line as `tracekit diff REF CAND`.
    ds = tracekit.open_diff(ref, cand)
    print(ds.attrs["summary_line"])

    # 2. Which (rank, step) pairs have violating elements at all? One line of xarray.
    per_rank_step = ds["violations"].sum("tensor")
    print("violating elements, rank x step:")
    print(per_rank_step.astype(int).to_pandas() if _has_pandas() else per_rank_step.values)

    # 3. The earliest step with a violation, and the ranks there.
    failing = ds["violations"] > 0
    step = int(ds["step"].where(failing.any(["rank", "tensor"]), drop=True).min())
    ranks = ds["rank"].where(failing.sel(step=step).any("tensor"), drop=True).values.astype(int).tolist()
    print(f"first failing step: {step}, ranks {ranks}")

    # 4. At that step and rank, the tensor off the most (among the violating ones), in compute order
    #    the diff uses: kinds in order outputs, loss, gradients, parameters, deltas.
    at = ds.sel(step=step, rank=ranks[0])
    bad = at["tensor"].where(at["violations"] > 0, drop=True).values.tolist()
    tensor = bad[0]  # the tensor coordinate is in compute order
    print(f"violating tensors at step {step} rank {ranks[0]}: {bad}; first: {tensor}")
    print({m: float(at[m].sel(tensor=tensor)) for m in ("max_abs_err", "max_rel_err", "cosine", "violations")})

    # 5. The element: where |cand - ref| peaks in that tensor (a lazy array, read only now).
    err = ds[f"abs_err/{tensor}"].sel(step=step, rank=ranks[0])
    where = {d: int(i) for d, i in err.argmax(...).items()}
    index = tuple(where[d] for d in err.dims)
    print(f"element {index}: |cand - ref| = {float(err.isel(where)):.3g}")

    # 6. The two values themselves, from each store, with tracekit.open.
    kind, name = tensor.split("/", 1)
    ref_v = float(tracekit.open(ref)[kind][name].sel(step=step, rank=ranks[0])[index])
    cand_v = float(tracekit.open(cand)[kind][name].sel(step=step, rank=ranks[0])[index])
    print(f"reference {ref_v:.9g}, candidate {cand_v:.9g} (ratio {cand_v / ref_v:.4g})")

    # 7. The accessor gives the same answer in one call, and it is the one `tracekit diff` prints.
    first = ds.tracekit.first_divergence()
    print("ds.tracekit.first_divergence():", {k: first[k] for k in ("step", "rank", "tensor", "index")})
    assert (first["step"], first["rank"], first["tensor"], first["index"]) == (step, ranks[0], tensor, index)
    return {"verdict": ds.tracekit.verdict, "step": step, "rank": ranks[0], "tensor": tensor, "index": index,
            "ref": ref_v, "cand": cand_v}


def _has_pandas() -> bool:
    try:
        import pandas  # noqa: F401 - xarray's own dependency; only used for nicer printing
    except ImportError:
        return False
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", metavar="DIR", help="record the two stores under DIR and keep them")
    args = ap.parse_args(argv)
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        found = inspect(*make_runs(args.keep))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            found = inspect(*make_runs(tmp))
    planted = (FAULT["step"], FAULT["rank"], f"{FAULT['kind']}/{FAULT['tensor']}", FAULT["index"])
    ok = (found["step"], found["rank"], found["tensor"], found["index"]) == planted
    print("found the planted fault" if ok else f"MISSED the planted fault {planted}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
