"""The recorder: captures a rank's tensors at optimizer-step boundaries and streams them to a store.

One step is bracketed by `begin_step` (gradients, parameters before the update) and `end_step`
(parameters after, deltas); `observe` supplies the step's output and loss. The explicit API hooks
these to one optimizer; the zero-code bootstrap hooks the same methods to the global optimizer
hooks, so both paths share this implementation.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import weakref
from typing import Any, Iterable

import torch
import torch.distributed as dist

from tracekit.errors import TracekitError
from tracekit.store import TensorData, create_store, holds_pieces, is_store
from tracekit.store.location import canonical
from tracekit.store.kinds import INITIAL_STEP
from tracekit.store.ownership import new_run_id
from tracekit.launch.parent_death import die_with_parent
from tracekit.environment import numeric_env, package_versions, run_environment
from tracekit.recorders import outcome
from tracekit.writer.handoff import Handoff, WriterFailed
from tracekit.launch.config import RecordConfig
from tracekit.recorders.coords import detect_coords
from tracekit.recorders.direct import DirectCapture
from tracekit.recorders.materialize import (canonical_name, flatten_output, full_cpu, gather_full_cpu, local_cpu, minus_piece, select,
                                            snapshot_piece)
from tracekit.store.keep import keeps_bytes
from tracekit.store.summaries import DigestCache
from tracekit.store.tensors import digested, from_torch, from_torch_piece
from tracekit.recorders.optim_state import state_tensors
from tracekit.recorders.replay import Replay
from tracekit.recorders.roots import coverage_of
from tracekit.store.coverage import KEY as COVERAGE_KEY, Coverage
from tracekit.recorders.precision import PROBE, note_forward, precision_context
from tracekit.store.precision import PRECISION_KEY


def _named_parameters(model=None, params=None) -> list[tuple[str, torch.nn.Parameter]]:
    if model is not None:
        pairs = list(model.named_parameters())
    elif isinstance(params, dict):
        pairs = list(params.items())
    elif params is not None:
        pairs = [(f"param{i}", p) for i, p in enumerate(params)]
    else:
        raise TracekitError("Recorder needs a model or its parameters")
    out, seen = [], set()
    for name, p in pairs:
        cname = canonical_name(name)
        if cname in seen:
            raise TracekitError(f"two parameters share the name {cname!r} once wrappers are stripped")
        seen.add(cname)
        out.append((cname, p))
    return out


_LIVE: "weakref.WeakSet[Recorder]" = weakref.WeakSet()
_HOOKS_INSTALLED = False


def _close_all() -> None:
    status, cause = outcome.exit_status()  # finished only if the program ended cleanly
    for rec in list(_LIVE):
        rec.close(status, cause)


def _forget_all_in_child() -> None:
    for rec in list(_LIVE):
        rec.forget_in_child()


def _install_process_hooks() -> None:
    """Once per process: close live recorders at exit, and disown them in forked children."""
    global _HOOKS_INSTALLED
    if _HOOKS_INSTALLED:
        return
    _HOOKS_INSTALLED = True
    atexit.register(_close_all)
    # zarr does its I/O through concurrent.futures, whose executors refuse new work once the
    # interpreter starts shutting down (before atexit handlers run). Closing from threading's
    # own exit hooks, registered after theirs and so run before them, lets the queues drain.
    import concurrent.futures.thread  # noqa: F401  its shutdown hook must be registered before ours

    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(_close_all)
        except RuntimeError:  # already shutting down: atexit above is all we can do
            pass
    os.register_at_fork(after_in_child=_forget_all_in_child)


# Signals whose default action ends the process without Python's cleanup. SIGINT raises
# KeyboardInterrupt, which closes the recorder like any exception; SIGQUIT and SIGKILL are left
# alone (a core dump is asked for; SIGKILL cannot be caught): the writer process sees the death.
_HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


# Set once a script's own Recorder starts recording in this process: the zero-code bootstrap
# (zerocode.py) then stands down, so nothing is recorded twice.
explicit_recorder_started = False


class Recorder:
    """Record one rank of a training loop into a tracekit store.

    >>> with Recorder(model, optimizer, run_info={"mode": "ddp"}) as rec:
    ...     for step in range(1, steps + 1):
    ...         out = model(x); loss = loss_fn(out, y); loss.backward()
    ...         rec.observe(output=out, loss=loss)
    ...         optimizer.step(); optimizer.zero_grad()

    The store is `store=` or $TRACEKIT_STORE (set by `tracekit record`); with neither, the recorder
    does nothing at all, so an instrumented script runs unchanged outside tracekit.
    """

    zero_code = False  # True for the recorder the zero-code bootstrap drives

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        params: Iterable | dict | None = None,
        store: str | os.PathLike | None = None,
        config: RecordConfig | None = None,
        coords: dict | None = None,
        run_info: dict | None = None,
    ):
        config = config or RecordConfig.from_env()
        if store is not None:
            config = config.with_store(os.fspath(store))
        self.config = config
        self.enabled = config.store is not None
        self.model = model
        self.optimizer = optimizer
        self._params = _named_parameters(model, params)
        self._recorded_names = set(select([n for n, _ in self._params], config.params))
        self._coord_overrides = coords or {}
        self.run_info = dict(run_info or {})
        self.step = 0  # steps completed so far; the step being trained is step + 1
        self._staged: dict[str, dict[str, torch.Tensor]] = {}
        self._before: list[tuple[str, torch.Tensor]] | None = None  # local snapshots, for deltas
        self._in_step = False
        self._initial_done = False
        self._grad_snapshot: list | None = None
        self._direct: DirectCapture | None = None  # the open step's entry, filled in place (direct.py)
        self._direct_buffers: dict[str, dict] = {}  # direct capture's buffers (snapshots), kept across steps
        self._hooks: list = []
        self._handoff: Handoff | None = None  # this rank's spool and the writer process behind it
        self._spooled = False  # the open step's capture is in the spool, not yet sealed
        self._started = False
        self._writes = False  # whether this rank keeps what it gathers (decided in start())
        self._pieces = False  # record sharded tensors as this rank's pieces, no gather (decided in start())
        self._closed = False
        self._forked = False  # this is a forked child of the recording process
        self._prev_handlers: dict = {}  # signal -> the handler ours replaced
        self.coords: dict = {}
        self._replay: Replay | None = None  # set in start() when config.replay_from names a reference
        self._tracer = None  # a recorders.tracing.Tracer while steps remain to be traced (--trace)
        # which of the optimizer's parameters are recorded, under which names (set by zero-code;
        # worked out at start() for an explicit model and optimizer)
        self.coverage: Coverage | None = None
        self._precision_sent = False  # the precision context is in the store (recorders/precision.py)

    # ---- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> "Recorder":
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.close(status="finished")
            else:
                self.close(status="failed", cause=outcome.one_line(exc) if exc is not None else exc_type.__name__)
        except KeyboardInterrupt:
            # Ctrl-C in the exit flush, maybe before the writer process heard how we end: tell it
            # now (it stores every spooled step), then let the interrupt end the program
            self.abandon("failed", "KeyboardInterrupt in the exit flush")
            raise

    def start(self) -> "Recorder":
        if self._started or not self.enabled:
            self._started = True
            return self
        self._started = True
        if not self.zero_code:
            global explicit_recorder_started
            explicit_recorder_started = True
        if self.config.run_id is not None:  # started by `tracekit record`: die with the launcher
            die_with_parent()
        self._ensure_root()
        self.coords = detect_coords((p for _, p in self._params), self._coord_overrides)
        self._writes = self.config.ranks is None or self.coords["rank"] in self.config.ranks
        # Pieces only when every rank writes its own (a reader needs them all) into a store that
        # assembles them (format 2); all ranks decide alike, so gathers elsewhere still match up.
        self._pieces = self.config.ranks is None and holds_pieces(self.config.store)
        if self.config.ranks is not None and self.coords["rank"] == 0:
            outside = self.config.ranks.from_rank(self.coords["world_size"])
            if outside:
                print(f"tracekit: warning: --ranks names rank(s) {outside.spec().replace(',', ', ')}, outside this "
                      f"{self.coords['world_size']}-rank job", file=sys.stderr, flush=True)
        if self.config.replay_from:
            self._replay = Replay.open(self.config, self.coords["rank"], self._params, lambda: self.optimizer)
        if self._writes:
            self._handoff = Handoff(self.config.store, self.coords["rank"], self._rank_attrs(),
                                    self.config.queue_mb * 1024 * 1024, nice=self.config.writer_nice,
                                    hold_bytes=self.config.hold_bytes)
        if self._replay is not None and not self.zero_code:
            # step 1 starts from the reference's initial parameters. (Zero-code starts us at the first
            # optimizer step, after step 1's backward: too late to load; its step 1 is its own.)
            self._replay.before_step(1)
        self.config = self.config.with_trace_default(self.zero_code)
        if self.config.trace and self._writes:
            from tracekit.recorders.tracing import Tracer  # torch dispatch machinery: only when tracing

            self._tracer = Tracer(self.config.trace, self.model, self.config.trace_full)
            if not self.zero_code:  # zero-code starts inside step 1: its first whole step is step 2
                self._trace_begin(1)
        if not self.zero_code:  # (zero-code started after the first forward, which it has noted)
            PROBE.reset()
        if self.model is not None and not self.zero_code:  # zero-code notes forwards in its own wrapper
            self._hooks.append(self.model.register_forward_pre_hook(lambda module, args: note_forward(module)))
        if self.optimizer is not None:
            self._hooks.append(self.optimizer.register_step_pre_hook(lambda *a: self.begin_step()))
            self._hooks.append(self.optimizer.register_step_post_hook(lambda *a: self.end_step()))
        self._install_exit_handlers()
        return self

    def _ensure_root(self) -> None:
        """With no launcher, rank 0 creates the store root and the others wait for it (a barrier)."""
        path = self.config.store
        distributed = dist.is_available() and dist.is_initialized()
        rank = dist.get_rank() if distributed else int(os.environ.get("RANK", 0))
        if rank == 0 and not is_store(path):
            replay = {"replay_of": canonical(self.config.replay_from)} if self.config.replay_from else {}
            create_store(path, {"launcher": None, "run_id": new_run_id(), **run_environment(), **replay})
        if distributed:
            dist.barrier()
        if not is_store(path):
            raise TracekitError(f"{path} is not a tracekit store and rank 0 did not create it")

    def _rank_attrs(self) -> dict:
        backend = dist.get_backend() if dist.is_available() and dist.is_initialized() else None
        devices = sorted({p.device.type for _, p in self._params})
        run = {"backend": backend, "device": devices[0] if len(devices) == 1 else devices,
               "world_size": self.coords["world_size"], **self.run_info}
        if self.coverage is None and self.optimizer is not None:
            self.coverage = coverage_of(self._params, self.optimizer, self.model)
        return {
            **({COVERAGE_KEY: self.coverage.to_attrs()} if self.coverage is not None else {}),
            "coords": self.coords,
            "run": run,
            "env": numeric_env(),
            "versions": package_versions(),  # per rank: torch-neuronx is only loaded in the workers
            "pid": os.getpid(),
            "config": {"kinds": list(self.config.kinds), "params": list(self.config.params), "every": self.config.every,
                       **({"full": list(self.config.full)} if self.config.full else {})},
            **(self._replay.attrs() if self._replay is not None else {}),
        }

    def _install_exit_handlers(self) -> None:
        _install_process_hooks()
        outcome.install()
        _LIVE.add(self)  # weakly: a recorder the program dropped is not kept alive by its exit hooks
        if threading.current_thread() is threading.main_thread():
            for sig in _HANDLED_SIGNALS:
                prev = signal.getsignal(sig)
                if prev is not signal.SIG_IGN:  # a job that ignores a signal keeps doing so
                    self._prev_handlers[sig] = prev
                    signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        # Every completed step is already in the spool: tell the writer process how we end (it
        # writes the rest on its own, so a slow disk cannot hold us up until a SIGKILL), then die
        # the way the signal would have killed us. A signal during close()'s wait lands here too.
        try:
            self.abandon("terminated", f"terminated by {signal.Signals(signum).name}")
        finally:
            self._restore_handlers()
            prev = self._prev_handlers.get(signum)
            if callable(prev) and prev != self._on_signal:
                prev(signum, frame)
            else:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

    def abandon(self, status: str, cause: str | None = None) -> None:
        """The process dies now (a signal): tell the writer process how the rank ends, without
        waiting. Every step handed over so far, and the open step's capture, is already spooled;
        the writer stores it on its own. Safe at any point of close(), which it supersedes: close()
        tells the writer before it counts as closed, so one interrupted earlier still sends here."""
        self.close(status=status, cause=cause, wait=False)

    def _restore_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, prev in self._prev_handlers.items():
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, prev)

    # ---- traces ------------------------------------------------------------------------------
    def untraced(self):
        """A context in which tracekit's own tensor work stays out of the step's trace."""
        return self._tracer.untraced() if self._tracer is not None else contextlib.nullcontext()

    def _trace_begin(self, step: int) -> None:
        if self._tracer is not None and self.config.traces_step(step) and not self._closed:
            self._tracer.start(step, self._params)

    def _trace_end(self, step: int) -> None:
        """Stop tracing `step` and hand its events to the writer process (a step cut short is dropped)."""
        tracer = self._tracer
        if tracer is None or tracer.current is None:
            return
        trace = tracer.stop()
        if not self.config.traces_after(step):
            tracer.close()
            self._tracer = None
        if trace.step != step or not self._writes or self._closed:
            return
        self._handoff.put_trace(step, trace.level, trace.events, [from_torch(k, t) for k, t in trace.full])

    def forget_in_child(self) -> None:
        # A forked child (a DataLoader worker) must never close the parent's rank group, nor keep
        # the writer process from seeing the parent's death.
        self._closed = self._forked = True
        if self._handoff is not None:
            self._handoff.forget_in_child()
        self._restore_handlers()

    def stop_writing(self) -> None:
        """After a failure: keep taking part in the gathers (collectives other ranks wait on), keep nothing."""
        self._writes = False

    def flush(self) -> None:
        """Block until every step handed over so far is in the store."""
        if self._handoff is not None:
            self._handoff.flush()

    def close(self, status: str = "finished", cause: str | None = None, wait: bool = True) -> None:
        """Mark the rank's status (with a one-line cause when it did not finish); with wait, block
        until every step is in the store. Safe to call more than once. The signal handlers stay in
        place until the store has everything: a SIGTERM during the wait still ends the rank with
        every spooled step kept."""
        if self._closed or not self._started:
            return
        # Tell the writer how the rank ends first, before counting as closed: a signal or Ctrl-C that
        # lands from here on finds either the message sent (send_close is idempotent: the first word
        # wins) or the recorder still open, so its abandon() -> close() sends it. Never neither.
        if self._handoff is not None:
            self._handoff.send_close(status, self._end_attrs(cause))
        if self._tracer is not None:  # a step still being traced never finished: not written
            self._tracer.stop()
            self._tracer.close()
            self._tracer = None
        self._closed = True
        self._drop_direct()
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        try:
            if self._handoff is not None:
                self._handoff.close(status, wait=wait, timeout=self.config.flush_timeout)
        except TracekitError as e:
            print(f"tracekit: {e}", file=sys.stderr)
        finally:
            if wait:
                self._restore_handlers()

    def _end_attrs(self, cause: str | None = None) -> dict:
        attrs = {"cause": cause} if cause else {}
        fallback = _neuron_fallback_ops()
        if fallback is not None:
            attrs["fallback_ops"] = fallback
        if self._replay is not None:
            attrs.update(self._replay.attrs())  # now with the steps actually replayed
        if not self._precision_sent and self._writes:  # no forward seen: the flags at least
            attrs.update(self._precision_attrs())
        return attrs

    def _precision_attrs(self) -> dict:
        self._precision_sent = True
        backend = dist.get_backend() if dist.is_available() and dist.is_initialized() else None
        devices = sorted({p.device.type for _, p in self._params})
        device = ",".join(devices) or None
        return {PRECISION_KEY: precision_context(self.model, device, backend).to_attrs()}

    # ---- the step ----------------------------------------------------------------------------
    def _active(self, step: int) -> bool:
        return self.enabled and self._started and not self._closed and self.config.records_step(step)

    def _gather(self, tensors: list[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Full CPU copies of the recorded tensors; every rank gathers, only writers keep."""
        return self._gather_all([(n, t) for n, t in tensors if n in self._recorded_names])

    def _gather_all(self, tensors: list[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        # No copy of CPU tensors: every caller spools what it gathers before returning to the loop,
        # and the spool file is the copy.
        if self._pieces:  # this rank's pieces of sharded tensors, no collective
            return local_cpu(tensors, copy=False)
        return gather_full_cpu(tensors, keep=self._writes, copy=False)

    def observe(self, output: Any = None, loss: torch.Tensor | float | None = None,
                local_loss: torch.Tensor | float | None = None) -> None:
        """Give the recorder the step's model output and (global) loss; call before optimizer.step()."""
        step = self.step + 1
        if not self._active(step):
            return
        with self.untraced():
            self._observe(output, loss, local_loss)

    def _observe(self, output, loss, local_loss) -> None:
        kinds = self.config.kinds
        if output is not None and "outputs" in kinds:
            items = list(flatten_output(output))
            if self._pieces:
                self._staged["outputs"] = local_cpu(items)
            else:
                self._staged["outputs"] = {n: c for n, t in items if (c := full_cpu(t, keep=self._writes)) is not None}
        for kind, value in (("loss", loss), ("local_loss", local_loss)):
            if value is not None and kind in kinds:
                t = value if isinstance(value, torch.Tensor) else torch.tensor(float(value))
                copy = full_cpu(t, keep=self._writes)
                if copy is not None:
                    self._staged[kind] = {kind: copy.reshape(())}

    def begin_step(self) -> None:
        """Before the optimizer update: capture gradients and the parameters about to change."""
        step = self.step + 1
        self._in_step = True
        if not (self.enabled and self._started and not self._closed):
            return
        with self.untraced():
            self._begin_step(step)
        if self._tracer is not None:
            self._tracer.enter_optimizer(self._params)  # the update is traced: it is part of the step

    def _begin_step(self, step: int) -> None:
        kinds = self.config.kinds
        recording = self.config.records_step(step)
        initial = "parameters" in kinds and not self._initial_done
        if initial:
            # step 0: the parameters the first update starts from (after any restore or replay load)
            self._initial_done = True
            initial_params = self._gather(self._params)
            if self._writes:
                self._submit(INITIAL_STEP, {"parameters": initial_params}, complete=False)
        self._drop_direct()
        if recording and self._pieces and self._writes and "optimizer_state" not in kinds:
            # the whole entry is known now: written in place, each byte once (direct.py)
            chosen = [(n, p) for n, p in self._params if n in self._recorded_names]
            grads = [(n, p.grad) for n, p in chosen if p.grad is not None] if "gradients" in kinds else []
            try:
                self._direct = DirectCapture.begin(self._handoff, step, self._staged, grads, chosen,
                                                   "parameters" in kinds, "deltas" in kinds, self._direct_buffers,
                                                   self.config.full)
            except OSError as e:  # the spool's filesystem is full or gone: as the general path says it
                raise WriterFailed(f"cannot spool step {step}: {e}") from None
            if self._direct is not None:
                return
        # Local snapshots only (no communication): the gathers of gradients, parameters and deltas
        # happen together after the update, in one collective per mesh and dtype.
        # In pieces mode the copies are of this rank's pieces (snapshot_piece), taken without DTensor dispatch.
        snap = snapshot_piece if self._pieces else (lambda t: t.detach().clone())
        if recording and "gradients" in kinds:
            self._grad_snapshot = [(n, snap(p.grad)) for n, p in self._params
                                   if p.grad is not None and n in self._recorded_names]
        if recording and "deltas" in kinds:
            self._before = [(n, snap(p)) for n, p in self._params if n in self._recorded_names]

    def end_step(self) -> None:
        """After the optimizer update: capture parameters and deltas, and hand the step to the writer."""
        self.capture_after()
        self.finish_step()

    def capture_after(self) -> None:
        """Gather the step's tensors as they are after the update (collectives on sharded tensors).
        Zero-code recording calls it again after each further optimizer of the same training step."""
        if self._in_step:
            self._trace_end(self.step + 1)  # the update is done: the traced step ends here
        if self._in_step and self._active(self.step + 1) and not self._capture_direct():
            captured = self._capture_after()
            if self._writes and self._handoff is not None:
                # spooled now, not at finish_step(): if the rank dies before the step is sealed
                # (zero-code seals at the next backward), the writer still stores this capture
                self._handoff.provisional(self.step + 1, self._spooled_entries({**self._staged, **captured}))
                self._spooled = True
        if self._in_step and self._replay is not None and not self._closed:
            # right after the update and its capture, before any next forward: the step taken is
            # the candidate's own; the next one restarts from the reference's state after it
            self._replay.before_step(self.step + 2)
        if self._in_step:
            self._trace_begin(self.step + 2)  # after any replay load: the next step starts now

    def finish_step(self) -> None:
        """Count the step and hand its capture to the writer; takes no collective."""
        if not self._in_step:
            return
        self._in_step = False
        self.step += 1
        step = self.step
        spooled, self._spooled = self._spooled, False
        self._staged = {}
        self._before = self._grad_snapshot = None
        self._drop_direct()
        if spooled and self._writes and not self._closed:
            self._handoff.seal()
        if PROBE.seen and not self._precision_sent and self._writes and not self._closed:
            # after the first step whose forward was seen: its autocast state is known now
            self._handoff.put(step, [], complete=False, extra={"attrs": self._precision_attrs()})

    def _capture_direct(self) -> bool:
        """Capture the open step into its entry laid out at begin_step, if it has one and the step
        still matches it; else hand the snapshots to the general path (False)."""
        direct = self._direct
        if direct is None:
            return False
        if self._writes:  # (no longer after stop_writing(): then nothing of the step is spooled)
            try:
                captured = direct.capture(self._staged, dict(self._params))
            except OSError as e:
                raise WriterFailed(f"cannot spool step {direct.step}: {e}") from None
            if captured:
                self._spooled = True
                return True
        self._grad_snapshot, self._before = direct.snapshots()
        self._drop_direct()
        return False

    def _drop_direct(self) -> None:
        if self._direct is not None:
            self._direct.abandon()
            self._direct = None

    def _capture_after(self) -> dict[str, dict[str, torch.Tensor]]:
        kinds = self.config.kinds
        current = dict(self._params)
        before, grads = self._before or [], self._grad_snapshot or []
        wanted = [("gradients", n, g) for n, g in grads]
        if "parameters" in kinds:
            wanted += [("parameters", n, p) for n, p in self._params if n in self._recorded_names]
        # delta on the local shards, in the parameter's dtype: elementwise, so it equals after - before of the full tensors
        wanted += [("deltas", n, minus_piece(current[n], b, n) if self._pieces else current[n].detach() - b) for n, b in before]
        if "optimizer_state" in kinds:
            chosen = [(n, p) for n, p in self._params if n in self._recorded_names]
            wanted += [("optimizer_state", n, t) for n, t in state_tensors(self.optimizer, chosen)]
        # one batched gather for every kind of the step (sharded state is gathered like parameters);
        # a gradient the direct capture digested (TensorData: hash and summary) needs none
        full = self._gather_all([(f"{kind}/{n}", t) for kind, n, t in wanted if not isinstance(t, TensorData)])
        staged: dict[str, dict[str, torch.Tensor]] = {}
        for kind, n, t in wanted:
            if isinstance(t, TensorData):
                staged.setdefault(kind, {})[n] = t
            elif f"{kind}/{n}" in full:
                staged.setdefault(kind, {})[n] = full[f"{kind}/{n}"]
        return staged

    def _submit(self, step: int, kinds: dict[str, dict[str, torch.Tensor]], complete: bool) -> None:
        self._handoff.put(step, self._spooled_entries(kinds), complete)

    def _spooled_entries(self, kinds: dict[str, dict[str, torch.Tensor]]) -> list:
        """_entries(), each tensor whose bytes are not kept (--full) hashed and summarized here, so
        that only its digest travels through the spool (the writer would read the bytes only to
        hash and summarize them); a complex one travels whole (its finiteness is checked on its bytes)."""
        entries = _entries(kinds)
        full = self.config.full
        if not full:
            return entries
        digests = self._direct_buffers.setdefault("digests", DigestCache())  # one cache with the direct capture's
        return [(kind, digested(t, digests, (kind, t.name))
                 if t.digest is None and t.data.dtype.kind != "c" and not keeps_bytes(full, kind, t.name) else t)
                for kind, t in entries]


def _entries(kinds: dict[str, dict[str, torch.Tensor]]) -> list:
    """Store entries of the staged tensors: whole tensors, (piece, Shard) pairs (local_cpu), or
    TensorData already (a digested gradient, DirectCapture.snapshots)."""
    return [(kind, t if isinstance(t, TensorData) else from_torch_piece(n, *t) if isinstance(t, tuple) else from_torch(n, t))
            for kind, tensors in kinds.items() for n, t in tensors.items()]


def _neuron_fallback_ops():
    """Ops torch-neuronx ran on the CPU instead of the device (a classic parity trap), if it is here."""
    try:
        import torch_neuronx  # noqa: F401
    except Exception:
        return None
    try:
        return [str(op) for op in torch_neuronx.get_fallback_ops()]
    except Exception as e:
        return [f"<unavailable: {e.__class__.__name__}: {e}>"]
