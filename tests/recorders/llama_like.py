"""A tiny Llama-like model and training loop that do to the order of module calls what
TorchTitan 0.3.0's llama3 does (torchtitan/models/common/decoder.py, components/loss.py,
distributed/activation_checkpoint.py and compile.py), without TorchTitan:

- blocks in a `layers` ModuleDict, wrapped by checkpoint_wrapper (full or selective AC, as
  TorchTitan's FullAC/SelectiveAC do), or checkpointed by torch.utils.checkpoint in forward;
- each block compiled in place (`block.compile(fullgraph=True)`, as apply_compile does), or the
  whole model wrapped by torch.compile (an OptimizedModule, `_orig_mod.` in its names);
- a chunked loss (ChunkedLossWrapper): the model's forward skips `lm_head` and returns the hidden
  states; the loss applies `model.lm_head` to each sequence chunk itself, runs backward per
  chunk, then backward through the decoder with the assembled gradient;
- FSDP2 (`fully_shard` on each block, on lm_head and on the root) when run under torchrun.

Imported by the one-process tests (test_roots.py); run as a script under torchrun by the FSDP2 test.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

if __name__ == "__main__":  # run as a script: end as the samples' ranks do (tests/cli/scripts/quick_end.py)
    sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cli", "scripts"))
    import quick_end  # before torch: its exit handler runs last

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, LAYERS, HEADS, SEQ, BATCH, CHUNKS = 64, 16, 3, 2, 16, 2, 4
AC_MODES = ("none", "full", "selective", "reentrant")


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, HEADS, DIM // HEADS).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, DIM))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w2, self.w3 = nn.Linear(DIM, 2 * DIM, bias=False), nn.Linear(2 * DIM, DIM, bias=False), \
            nn.Linear(DIM, 2 * DIM, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm, self.attention = RMSNorm(DIM), Attention()
        self.ffn_norm, self.feed_forward = RMSNorm(DIM), FeedForward()

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class TinyLlama(nn.Module):
    _skip_lm_head = False  # set for the chunked loss, as TorchTitan's trainer does

    def __init__(self, reentrant_checkpoint: bool = False):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(LAYERS)})
        self.norm = RMSNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        self.reentrant_checkpoint = reentrant_checkpoint

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            if self.reentrant_checkpoint:
                h = torch.utils.checkpoint.checkpoint(layer, h, use_reentrant=True)
            else:
                h = layer(h)
        h = self.norm(h)
        return h if self._skip_lm_head else self.lm_head(h)


def _every_other_mm_policy():
    """SelectiveAC's policy, reduced: save every other matmul, recompute the rest."""
    from torch.utils.checkpoint import CheckpointPolicy

    count = {"forward": 0, "recompute": 0}

    def policy(ctx, func, *args, **kwargs):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.linear.default):
            mode = "recompute" if ctx.is_recompute else "forward"
            count[mode] += 1
            return CheckpointPolicy.MUST_SAVE if count[mode] % 2 else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def build(ac: str = "none", compile_blocks: bool = False, seed: int = 0) -> TinyLlama:
    """The model with AC applied to each block as TorchTitan applies it (replacing the block in
    `layers` by its checkpoint_wrapper), then each block compiled in place."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    assert ac in AC_MODES, ac
    torch.manual_seed(seed)
    model = TinyLlama(reentrant_checkpoint=ac == "reentrant")
    if ac in ("full", "selective"):
        context = {"context_fn": lambda: create_selective_checkpoint_contexts(_every_other_mm_policy())} \
            if ac == "selective" else {}
        for layer_id, block in model.layers.named_children():
            model.layers.register_module(layer_id, checkpoint_wrapper(block, preserve_rng_state=True, **context))
    if compile_blocks:
        for block in model.layers.values():
            block.compile(backend="eager", fullgraph=True)
    return model


def batch(step: int, rank: int = 0):
    g = torch.Generator().manual_seed(1000 * rank + step)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def chunked_loss(hidden: torch.Tensor, labels: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
    """ChunkedLossWrapper's flow: lm_head + loss + backward per chunk of detached hidden states,
    then backward through the decoder with the assembled gradient. Returns the loss (detached)."""
    chunks = [c.detach().requires_grad_(True) for c in hidden.split(SEQ // CHUNKS, dim=1)]
    total = hidden.new_zeros(())
    grads = []
    for h_chunk, y_chunk in zip(chunks, labels.split(SEQ // CHUNKS, dim=1)):
        logits = lm_head(h_chunk)
        loss = F.cross_entropy(logits.flatten(0, 1), y_chunk.flatten(), reduction="sum") / labels.numel()
        loss.backward()
        grads.append(h_chunk.grad)
        total = total + loss.detach()
    hidden.backward(torch.cat(grads, dim=1))
    return total


def train(call, model: TinyLlama, optimizer, steps: int, chunked: bool = False, rank: int = 0) -> list:
    """The loop; returns what the root's forward returned at each step, detached."""
    model._skip_lm_head = chunked
    outputs = []
    for step in range(1, steps + 1):
        tokens, labels = batch(step, rank)
        out = call(tokens)
        if chunked:
            chunked_loss(out, labels, model.lm_head)
        else:
            F.cross_entropy(out.flatten(0, 1), labels.flatten()).backward()
        outputs.append(out.detach().clone())
        optimizer.step()
        optimizer.zero_grad()
    return outputs


def main() -> None:
    """No tracekit code. Under torchrun: FSDP2 (fully_shard per block, lm_head, root) on gloo;
    without it, one process. --free-param adds to the optimizer a tensor no module owns."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    parser = argparse.ArgumentParser()
    parser.add_argument("--ac", choices=AC_MODES, default="selective")
    parser.add_argument("--chunked", action="store_true")
    parser.add_argument("--free-param", action="store_true")
    parser.add_argument("--compile-blocks", action="store_true", help="each block compiled in place (eager backend)")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    distributed = "WORLD_SIZE" in os.environ
    model = build(args.ac, compile_blocks=args.compile_blocks)
    if distributed:
        dist.init_process_group("gloo")
        for block in model.layers.values():
            fully_shard(block)
        fully_shard(model.lm_head)
        fully_shard(model)
    params = [*model.parameters(), *([nn.Parameter(torch.ones(2, 3))] if args.free_param else [])]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    train(model, model, optimizer, args.steps, chunked=args.chunked, rank=dist.get_rank() if distributed else 0)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.exit(quick_end.ending(0))  # after every exit handler (the recorder's close), without teardown
