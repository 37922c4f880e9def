"""A chunked loss step and its model: the step-loss tests' workload, which the zero-code tests also record (test_step_loss, test_zerocode)."""

import torch

from tracekit.recorders.step_loss import StepLoss


class Backward(torch.autograd.Function):
    """torchtitan's _DecoderOutputGradientBackProp: the total's value, the chunks' gradient below."""

    @staticmethod
    def forward(ctx, hidden, grad, total):
        ctx.save_for_backward(grad)
        return total.detach()

    @staticmethod
    def backward(ctx, _):
        (grad,) = ctx.saved_tensors
        return grad, None, None


def model_of():
    torch.manual_seed(0)
    return torch.nn.Linear(8, 8), torch.nn.Linear(8, 3)  # decoder, lm_head


def chunked_step(decoder, head, x, y, loss: StepLoss, chunks=4):
    """One microbatch the torchtitan way; returns the loss torchtitan logs for it."""
    hidden = decoder(x)
    total = torch.zeros(())
    grad = torch.zeros_like(hidden)
    for i, (h, t) in enumerate(zip(hidden.detach().chunk(chunks), y.chunk(chunks))):
        h.requires_grad_()
        chunk_loss = torch.nn.functional.cross_entropy(head(h), t, reduction="sum") / len(y)
        loss.add(chunk_loss)
        chunk_loss.backward()
        grad[i * len(h):(i + 1) * len(h)] = h.grad
        total = total + chunk_loss.detach()
    final = Backward.apply(hidden, grad, total)
    loss.add(final)
    final.backward()
    return final.detach()


def batch(seed, n=16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)
