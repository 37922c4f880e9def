"""The rule for several backward() calls in one step (recorders/step_loss.py, docs/ZEROCODE.md),
checked on the shapes of real loops: torchtitan 0.3.0's chunked loss (per-chunk backward()s on
detached hidden-state chunks, then a backward on the accumulated total through the decoder, as
ChunkedLossWrapper and _DecoderOutputGradientBackProp do it) and gradient accumulation."""

import torch

from tracekit.recorders.step_loss import StepLoss, is_partial

from tests.recorders.step_loss_runs import batch, chunked_step, model_of


def test_a_chunked_loss_counts_once_the_total_its_final_backward_ran_on():
    decoder, head = model_of()
    loss = StepLoss()
    logged = chunked_step(decoder, head, *batch(1), loss)
    got = loss.take()
    assert torch.equal(got, logged)  # not the 2x that summing all 5 backward() scalars gives
    assert loss.take() is None  # taken: the next step starts empty


def test_gradient_accumulation_sums_the_microbatches_chunked_or_not():
    decoder, head = model_of()
    loss = StepLoss()
    logged = sum(chunked_step(decoder, head, *batch(s), loss) for s in (1, 2, 3))  # torchtitan's accumulated_loss
    assert torch.equal(loss.take(), logged)
    plain = []
    for s in (1, 2):
        x, y = batch(s)
        mb = torch.nn.functional.cross_entropy(head(decoder(x)), y) / 2
        loss.add(mb)
        mb.backward()
        plain.append(mb.detach())
    assert torch.equal(loss.take(), plain[0] + plain[1])


def test_chunks_alone_are_summed_when_no_whole_backward_follows():
    decoder, head = model_of()
    loss = StepLoss()
    x, y = batch(1)
    hidden = decoder(x)
    parts = []
    for h, t in zip(hidden.detach().chunk(2), y.chunk(2)):
        h.requires_grad_()
        part = torch.nn.functional.cross_entropy(head(h), t, reduction="sum") / len(y)
        loss.add(part)
        part.backward()
        parts.append(part.detach())
    assert torch.equal(loss.take(), parts[0] + parts[1])


def test_partial_means_a_leaf_that_is_not_a_parameter():
    decoder, head = model_of()
    x, _ = batch(1)
    whole = head(decoder(x)).sum()
    assert not is_partial(whole.grad_fn)
    chunk = head(decoder(x).detach().requires_grad_()).sum()
    assert is_partial(chunk.grad_fn)
