"""Store contents that tests in several folders build stores from (with tracekit.testing.write_store):
one place, instead of tests importing each other's private helpers."""

import numpy as np


def small_run_data():
    """2 ranks, steps 0-3: parameters every step, a loss from step 1; small, exact, nonzero values."""
    # no zeros and no NaNs: under --exact every flipped bit is a visible difference
    def t(n, step, rank):
        return (np.arange(1, n + 1, dtype=np.float32) + 0.25) * (step + 1) * (rank + 1)

    return {r: {s: {"parameters": {"layer.weight": t(6, s, r).reshape(2, 3), "layer.bias": t(2, s, r)},
                    **({"loss": {"loss": np.float32(1.5 * (s + 1))}} if s else {})}
                for s in range(4)} for r in range(2)}


IN, HIDDEN, OUT, BATCH = 8, 16, 4, 16


def simulated_ddp(world=2, steps=6, lr=0.1, lr_scale=1.0, loss_scale=None, nan_grad=None, reported_loss_scale=None, target_scale=3.0):
    """Simulated DDP: each rank sees its slice of a fixed global batch, gradients are averaged.

    Computed in float64 and recorded in float32, so runs with different world sizes record the
    same full tensors. Faults: lr_scale (the candidate's SGD uses lr * lr_scale),
    loss_scale=(rank, step, factor) scales one rank's local loss before backward,
    nan_grad=(rank, step) puts a NaN in one rank's averaged gradient (and so in its update),
    reported_loss_scale=(step, factor) scales only the recorded loss.
    """
    import torch  # here: the store tests that use small_run_data never load torch

    g = torch.Generator().manual_seed(0)
    init = {"0.weight": torch.randn(HIDDEN, IN, generator=g, dtype=torch.float64) * 0.5,
            "0.bias": torch.randn(HIDDEN, generator=g, dtype=torch.float64) * 0.1,
            "2.weight": torch.randn(OUT, HIDDEN, generator=g, dtype=torch.float64) * 0.5,
            "2.bias": torch.zeros(OUT, dtype=torch.float64)}
    params = [{k: v.clone() for k, v in init.items()} for _ in range(world)]  # one replica per rank
    f32 = lambda t: t.detach().to(torch.float32).numpy().copy()  # noqa: E731
    data = {r: {0: {"parameters": {k: f32(v) for k, v in init.items()}}} for r in range(world)}
    per = BATCH // world
    for step in range(1, steps + 1):
        gs = torch.Generator().manual_seed(1000 + step)
        x = torch.randn(BATCH, IN, generator=gs, dtype=torch.float64)
        y = torch.randn(BATCH, OUT, generator=gs, dtype=torch.float64) * target_scale
        outs, local_losses, grads = [], [], []
        for r in range(world):
            p = {k: v.clone().requires_grad_(True) for k, v in params[r].items()}
            xs, ys = x[r * per:(r + 1) * per], y[r * per:(r + 1) * per]
            h = torch.relu(xs @ p["0.weight"].T + p["0.bias"])
            out = h @ p["2.weight"].T + p["2.bias"]
            loss = ((out - ys) ** 2).mean()
            scaled = loss * (loss_scale[2] if loss_scale and loss_scale[:2] == (r, step) else 1.0)
            scaled.backward()
            outs.append(out)
            local_losses.append(loss.detach())
            grads.append({k: v.grad for k, v in p.items()})
        avg = {k: sum(gr[k] for gr in grads) / world for k in init}
        global_loss = sum(local_losses) / world
        for r in range(world):
            g_r = {k: v.clone() for k, v in avg.items()}
            if nan_grad == (r, step):
                g_r["0.weight"][0, 0] = float("nan")
            before = params[r]
            params[r] = {k: before[k] - lr * lr_scale * g_r[k] for k in init}
            reported = global_loss * (reported_loss_scale[1] if reported_loss_scale and reported_loss_scale[0] == step else 1.0)
            data[r][step] = {
                "outputs": {"output": f32(outs[r])},
                "loss": {"loss": np.float32(reported.item())},
                "gradients": {k: f32(v) for k, v in g_r.items()},
                "parameters": {k: f32(v) for k, v in params[r].items()},
                "deltas": {k: f32(params[r][k] - before[k]) for k in init},
            }
    return data
