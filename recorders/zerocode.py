"""Zero-code recording: `tracekit record` records a training script that never imports tracekit.

The bootstrap (bootstrap/sitecustomize.py) calls `install()` right after the script imports torch.
From then on, in this process:
  - torch.nn.Module.__call__ is wrapped until the first training step, to find the model and its
    output (outermost.py); then the model alone is followed with a forward hook;
  - torch.autograd.backward (which Tensor.backward calls) notes the scalar it ran on: the loss;
  - the global optimizer step hooks bracket each training step and drive the same Recorder the
    explicit API uses (recorder.py): observe() and begin_step() at the pre hook, capture_after()
    at the post hook, finish_step() once the step is over.

What a training step is (docs/ZEROCODE.md has the user-facing version):
  - The training optimizer is the first optimizer whose step() starts after a backward(), or the
    first whose class is named by TRACEKIT_OPTIMIZER. Each of its step() calls starts a step.
  - Optimizers stepped from inside another's step() (a container of optimizers) belong to it.
    Other optimizers stepped after it, before the next backward(), belong to the same step: the
    parameters are gathered again after each, and the step is handed to the writer only at the
    next backward(), the next training step or the exit (which need no collective).
  - Nothing is recorded unless this process is a worker of the recorded job: RANK is set or
    torch.distributed is initialized (torchrun), or it is the launcher's own child (a world of one).
    DataLoader workers never record; neither does anything when the script's own Recorder runs.

A failure is reported once on stderr and the job goes on: the rank keeps taking part in the
gathers (collectives the other ranks wait on) but writes nothing more. TRACEKIT_STRICT=1
(`tracekit record --strict`) raises instead, failing the job.
"""

from __future__ import annotations

import atexit
import functools
import os
import signal
import sys
import threading
from dataclasses import replace

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from tracekit.recorders import outcome

from tracekit.errors import TracekitError
from tracekit.recorders import recorder as recorder_module
from tracekit.launch.bootstrap_env import ENV_LAUNCHER_PID, ENV_LOSS_REDUCTION, ENV_MODEL, ENV_OPTIMIZER, ENV_STRICT
from tracekit.launch.config import RecordConfig
from tracekit.recorders.step_loss import StepLoss
from tracekit.store.global_loss import derivation_attrs
from tracekit.recorders.loss_reduction import AUTO
from tracekit.recorders.loss_reduction import resolve as resolve_reduction
from tracekit.recorders.outermost import OutermostCalls
from tracekit.recorders.replay import ReplayError
from tracekit.inspect.coverage import left_out_line


class ZeroCodeRecorder(recorder_module.Recorder):
    """The Recorder driven by the bootstrap (its start() does not make the bootstrap stand down).

    It records each rank's local loss only; its group says how the global loss follows from the
    ranks' local losses (derived at finalize or when read: never a collective in the rank)."""

    zero_code = True
    loss_reduction = "mean"
    loss_reduction_why: str | None = None  # how the reduction was chosen (recorders/loss_reduction.py)

    def _rank_attrs(self) -> dict:
        attrs = super()._rank_attrs()
        if "loss" in self.config.kinds:
            attrs.update(derivation_attrs(self.loss_reduction, self.loss_reduction_why))
        return attrs


def _matches(optimizer: torch.optim.Optimizer, name: str) -> bool:
    cls = type(optimizer)
    return name in (cls.__name__, cls.__qualname__, f"{cls.__module__}.{cls.__qualname__}")


class ZeroCode:
    """One process's zero-code recording: the patches, the step state machine and its Recorder."""

    def __init__(self, environ=None):
        env = os.environ if environ is None else environ
        self.strict = env.get(ENV_STRICT) == "1"
        self.optimizer_name = env.get(ENV_OPTIMIZER) or None
        self.model_name = env.get(ENV_MODEL) or None
        self.launcher_pid = env.get(ENV_LAUNCHER_PID)
        self.env = env
        self.calls = OutermostCalls()
        self.recorder: ZeroCodeRecorder | None = None
        self.training: torch.optim.Optimizer | None = None
        self.loss_reduction = env.get(ENV_LOSS_REDUCTION) or AUTO
        self._handles: list = []
        self._original_backward = None
        self._backward_seen = False
        self._backward_depth = 0  # backward() calls in progress
        self._loss = StepLoss()  # the scalars backward ran on since the last step (step_loss.py: the rule)
        self._depth = 0  # optimizer step() calls in progress (a container's inner ones nest)
        self._window = False  # a training step is open: begun, not yet handed to the writer
        self._replay_loaded = False  # replay put the next step's start state in place; no backward since
        self.stood_down = False
        self.failed = False
        self.compiled_optimizer = False  # an optimizer step ran compiled, out of our hooks' sight

    # ---- installing and removing ----------------------------------------------------------
    def install(self) -> "ZeroCode":
        self.calls.discover()
        original = torch.autograd.backward

        @functools.wraps(original)
        def backward(tensors, *args, **kwargs):
            # A backward run from inside another (reentrant activation checkpointing) is not a loss.
            if torch.compiler.is_compiling() or self._backward_depth:
                return original(tensors, *args, **kwargs)
            self._guarded(self._on_backward, tensors)
            self._backward_depth += 1
            try:
                return original(tensors, *args, **kwargs)
            finally:
                self._backward_depth -= 1

        self._original_backward, self._backward = original, backward
        torch.autograd.backward = backward
        self._handles = [register_optimizer_step_pre_hook(self._pre_hook),
                         register_optimizer_step_post_hook(self._post_hook)]
        return self

    # torch.compile(optimizer.step) traces these hooks: inside it they only note that the step is
    # compiled (an attribute store dynamo replays, no graph break); it is reported at the next backward.
    def _pre_hook(self, optimizer, args, kwargs) -> None:
        if torch.compiler.is_compiling():
            self.compiled_optimizer = True
            return
        self._guarded(self._on_pre, optimizer)

    def _post_hook(self, optimizer, args, kwargs) -> None:
        if torch.compiler.is_compiling():
            return
        self._guarded(self._on_post, optimizer)

    def stand_down(self, final: bool = False) -> None:
        """Stop recording: hand over a step already captured, close the recorder, undo the patches.

        Unless `final` (uninstall), the global optimizer hooks and the nn.Module.__call__ wrapper
        stay in place doing nothing: stand_down() is often called from inside an optimizer hook
        while torch iterates over them, and torch.compile may have guarded on the wrapper.
        """
        if final:
            for h in self._handles:
                h.remove()
            self._handles.clear()
            self.calls.unwrap()
        if self.stood_down:
            return
        self.stood_down = True
        if self._original_backward is not None and torch.autograd.backward is self._backward:
            torch.autograd.backward = self._original_backward
        self.calls.stop()
        if self.recorder is not None:
            self._finish_open_step()
            self.recorder.close()

    # ---- failures -------------------------------------------------------------------------
    def _guarded(self, fn, *args) -> None:
        if self.stood_down:
            return
        try:
            fn(*args)
        except Exception as error:
            self._fail(error)

    def _fail(self, error: Exception) -> None:
        if self.strict:
            raise error
        if not self.failed:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else os.environ.get("RANK", "0")
            print(f"tracekit: zero-code recording failed on rank {rank}: {type(error).__name__}: {error}; "
                  "the job goes on without recording (tracekit record --strict fails it instead)",
                  file=sys.stderr, flush=True)
        self.failed = True
        if self.recorder is None:
            self.stand_down()  # nothing gathered yet: no collective of ours to keep in step with
        else:
            self.recorder.stop_writing()

    # ---- events ---------------------------------------------------------------------------
    def _on_backward(self, tensors) -> None:
        if self.compiled_optimizer:
            raise TracekitError("the optimizer step runs under torch.compile, which compiles the optimizer "
                                "hooks away: compile the model only, or record with tracekit's Recorder")
        self._replay_loaded = False
        if self._window and self._depth == 0:
            self._finish_open_step()  # the next forward/backward has begun: the last step is over
        items = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors or ())
        for t in items:
            if isinstance(t, torch.Tensor) and t.numel() == 1:
                self._loss.add(t)
        self._backward_seen = True

    def _on_pre(self, optimizer: torch.optim.Optimizer) -> None:
        if optimizer is self.training and self._depth > 0:
            # The training optimizer never nests in itself: its last step raised, and torch skipped
            # the post hooks that would have closed it. Start over rather than record nothing more.
            self._depth = 0
            self._window = False
            self._replay_loaded = False
        if self._replay_loaded and optimizer is not self.training and self._depth == 0:
            raise ReplayError("another optimizer stepped after the training optimizer in a replayed step; "
                              "replay restores the whole state before the next step and cannot include it")
        self._depth += 1
        if self._depth > 1:
            return  # an optimizer stepped by a container: part of the container's step
        if self.training is None:
            wanted = _matches(optimizer, self.optimizer_name) if self.optimizer_name else self._backward_seen
            if not wanted or not self._start(optimizer):
                return
        if optimizer is not self.training:
            return  # another optimizer of the open step (or of no step): gathered after, in _on_post
        if self._window:
            self._finish_open_step()
        self._begin_step()

    def _on_post(self, optimizer: torch.optim.Optimizer) -> None:
        self._depth = max(0, self._depth - 1)
        if self._depth == 0 and self._window:
            self.recorder.capture_after()  # again after each optimizer of the step: the last one counts
            if self.recorder.config.replay_from:
                self._finish_open_step()  # replay loads the next step's start now, before its forward
                self._replay_loaded = True

    # ---- the step -------------------------------------------------------------------------
    def _begin_step(self) -> None:
        rec = self.recorder
        output = self.calls.take_output()
        # Only this rank's own loss: the global one is derived from every rank's when the store is
        # finalized or read (tracekit/store/global_loss.py), so no peer can cost this rank its step.
        rec.observe(output=output, local_loss=self._loss.take())
        self._window = True
        rec.begin_step()

    def _finish_open_step(self) -> None:
        if self._window:
            self._window = False
            self.recorder.finish_step()

    def _at_exit(self) -> None:
        """Hand over the last step and close, while the interpreter can still write (see _start)."""
        if self.stood_down or self.recorder is None:
            return
        try:
            status, cause = outcome.exit_status()  # failed if the script raised
            self._guarded(self._finish_open_step)
            # Under `tracekit record` the rank does not wait for its writer: the launcher waits for
            # every writer before it finalizes, and bounds that wait by --flush-timeout from the
            # rank's end (launcher.wait_for_writers). The writer stores the steps it held back
            # (--hold-mb) while this process and the job's launcher tear down, which leave a third
            # to a half of the cores idle (0.5-0.8 s for TorchTitan's debug model on 2 cores).
            self._guarded(self.recorder.close, status, cause, self.launcher_pid is None)
        except KeyboardInterrupt:
            # A SIGINT during the exit flush, wherever it lands (even inside close(), before the
            # writer process heard how we end): say so to the writer, which stores every spooled
            # step, the open step's capture included, then die of the signal. Python would
            # otherwise swallow it here and exit 0.
            self.recorder.abandon("failed", "KeyboardInterrupt in the exit flush")
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)

    # ---- the first training step ----------------------------------------------------------
    def _is_worker(self) -> bool:
        if "RANK" in os.environ or (dist.is_available() and dist.is_initialized()):
            return True
        return self.launcher_pid is not None and str(os.getppid()) == self.launcher_pid

    def _start(self, optimizer: torch.optim.Optimizer) -> bool:
        """Decide whether this process records; if so, find the model and start the Recorder."""
        if recorder_module.explicit_recorder_started or not self._is_worker():
            self.stand_down()
            return False
        if torch.utils.data.get_worker_info() is not None:
            return False  # a DataLoader worker: never the training loop
        optimizer_params = [p for group in optimizer.param_groups for p in group["params"]]
        found = self.calls.settle(optimizer_params, self.model_name)  # raises if --model names no module
        if self.strict and not found.coverage.complete:
            raise TracekitError(f"{left_out_line(found.coverage)} (--strict)")
        params = found.params
        model = found.roots[0][1] if len(found.roots) == 1 else None
        run_info = {"recorded_by": "zero-code", "optimizer": type(optimizer).__qualname__,
                    "model": ", ".join(r.class_name for r in found.coverage.roots) or None}
        config = RecordConfig.from_env(self.env)
        if "loss" in config.kinds and "local_loss" not in config.kinds:  # what the global loss is derived from
            config = replace(config, kinds=(*config.kinds, "local_loss"))
        rec = ZeroCodeRecorder(params=params, config=config, run_info=run_info)
        rec.coverage = found.coverage
        # auto: TorchTitan's trainer taking this step says its losses add up (recorders/loss_reduction.py)
        rec.loss_reduction, rec.loss_reduction_why = resolve_reduction(self.loss_reduction)
        derivation_attrs(rec.loss_reduction)  # an unknown reduction fails here, before anything starts
        rec.model = model  # module paths for --trace (None: the ops of the step carry no module path)
        self.training = optimizer
        self.recorder = rec
        try:
            rec.start()
        except Exception as error:  # this rank only, maybe: report, then keep joining the collectives
            self._fail(error)
        rec.optimizer = optimizer  # for the optimizer_state kind (set after start: no instance hooks)
        # After start(): exit hooks run newest first, and the open step must be handed over before
        # the recorders close.
        _register_early_exit(self._at_exit)
        return True


def _register_early_exit(fn) -> None:
    """Run fn when the main thread ends, before the thread pools shut down.

    Plain atexit runs too late: by then concurrent.futures has refused new work, and zarr writes
    through it. threading's own exit hooks run first, newest first: importing concurrent.futures'
    pool before registering puts fn ahead of its shutdown.
    """
    import concurrent.futures.thread  # noqa: F401  registers the pools' shutdown first

    register = getattr(threading, "_register_atexit", None)
    (register or atexit.register)(fn)


_ACTIVE: ZeroCode | None = None


def install(environ=None) -> ZeroCode | None:
    """Start zero-code recording in this process (idempotent). Called by the bootstrap after torch
    is imported; a failure is reported once (or raised under --strict), never left to break the job."""
    global _ACTIVE
    if _ACTIVE is not None and not _ACTIVE.stood_down:
        return _ACTIVE
    zero = ZeroCode(environ)
    try:
        _ACTIVE = zero.install()
    except Exception as error:
        zero._fail(error)
        return None
    return _ACTIVE


def uninstall() -> None:
    """Stand down (tests; a process that wants no recording after all)."""
    global _ACTIVE
    if _ACTIVE is not None:
        _ACTIVE.stand_down(final=True)
        _ACTIVE = None
