"""The recorder: captures a rank's tensors at optimizer-step boundaries and streams them to a store.

One step is bracketed by `begin_step` (gradients, parameters before the update) and `end_step`
(parameters after, deltas); `observe` supplies the step's output and loss. The explicit API hooks
these to one optimizer; the zero-code bootstrap hooks the same methods to the global optimizer
hooks, so both paths share this implementation.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import weakref
from typing import Any, Iterable

import torch
import torch.distributed as dist

from tracekit.errors import TracekitError
from tracekit.store import RankWriter, create_store, is_store
from tracekit.store.format import INITIAL_STEP
from tracekit.store.ownership import new_run_id
from tracekit.recorders.parent_death import die_with_parent
from tracekit.environment import numeric_env, package_versions, run_environment
from tracekit.recorders.background import BackgroundWriter
from tracekit.recorders.config import RecordConfig
from tracekit.recorders.coords import detect_coords
from tracekit.recorders.materialize import canonical_name, flatten_output, full_cpu, gather_full_cpu, select
from tracekit.store.tensors import from_torch
from tracekit.recorders.optim_state import state_tensors
from tracekit.recorders.replay import Replay


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
    for rec in list(_LIVE):
        rec.close("finished")


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


def _nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


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
        self._captured: dict | None = None  # capture_after()'s tensors, handed over by finish_step()
        self._hooks: list = []
        self._writer: RankWriter | None = None
        self._bg: BackgroundWriter | None = None
        self._started = False
        self._writes = False  # whether this rank keeps what it gathers (decided in start())
        self._closed = False
        self._prev_sigterm = None
        self.coords: dict = {}
        self._replay: Replay | None = None  # set in start() when config.replay_from names a reference

    # ---- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> "Recorder":
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(status="finished" if exc_type is None else "failed")

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
        if self.config.ranks is not None and self.coords["rank"] == 0:
            outside = sorted(r for r in self.config.ranks if r >= self.coords["world_size"])
            if outside:
                print(f"tracekit: warning: --ranks names rank(s) {', '.join(map(str, outside))}, outside this "
                      f"{self.coords['world_size']}-rank job", file=sys.stderr, flush=True)
        if self.config.replay_from:
            self._replay = Replay.open(self.config, self.coords["rank"], self._params, lambda: self.optimizer)
        if self._writes:
            self._writer = RankWriter(self.config.store, self.coords["rank"], self._rank_attrs(), run_id=self.config.run_id)
            self._bg = BackgroundWriter(self.config.queue_mb * 1024 * 1024, name=f"tracekit-writer-{self.coords['rank']}")
        if self._replay is not None and not self.zero_code:
            # step 1 starts from the reference's initial parameters. (Zero-code starts us at the first
            # optimizer step, after step 1's backward: too late to load; its step 1 is its own.)
            self._replay.before_step(1)
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
            replay = {"replay_of": os.path.abspath(self.config.replay_from)} if self.config.replay_from else {}
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
        return {
            "coords": self.coords,
            "run": run,
            "env": numeric_env(),
            "versions": package_versions(),  # per rank: torch-neuronx is only loaded in the workers
            "pid": os.getpid(),
            "config": {"kinds": list(self.config.kinds), "params": list(self.config.params), "every": self.config.every},
            **(self._replay.attrs() if self._replay is not None else {}),
        }

    def _install_exit_handlers(self) -> None:
        _install_process_hooks()
        _LIVE.add(self)  # weakly: a recorder the program dropped is not kept alive by its exit hooks
        if threading.current_thread() is threading.main_thread():
            prev = signal.getsignal(signal.SIGTERM)
            if prev is not signal.SIG_IGN:  # a job that ignores SIGTERM keeps doing so
                self._prev_sigterm = prev
                signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame) -> None:
        # Flush what was fully captured, then die the way SIGTERM would have killed us.
        try:
            self.close(status="terminated")
        finally:
            prev = self._prev_sigterm
            if callable(prev):
                prev(signum, frame)
            else:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)

    def forget_in_child(self) -> None:
        # A forked child (a DataLoader worker) must never close the parent's rank group.
        self._closed = True
        if self._writer is not None:
            self._writer.forget_in_child()
        if self._prev_sigterm is not None and signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, self._prev_sigterm)

    def stop_writing(self) -> None:
        """After a failure: keep taking part in the gathers (collectives other ranks wait on), keep nothing."""
        self._writes = False

    def flush(self) -> None:
        """Block until every step handed to the background writer is on disk."""
        if self._bg is not None:
            self._bg.flush()

    def close(self, status: str = "finished") -> None:
        """Write out everything queued and mark the rank's status. Safe to call more than once."""
        if self._closed or not self._started:
            return
        self._closed = True
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        if threading.current_thread() is threading.main_thread() and self._prev_sigterm is not None:
            if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                signal.signal(signal.SIGTERM, self._prev_sigterm)
        if self._bg is None:
            return
        try:
            self._bg.close()
        except TracekitError as e:
            status = "failed"
            print(f"tracekit: {e}", file=sys.stderr)
        fallback = _neuron_fallback_ops()
        if fallback is not None:
            self._writer.update_attrs(fallback_ops=fallback)
        if self._replay is not None:
            self._writer.update_attrs(**self._replay.attrs())  # now with the steps actually replayed
        self._writer.close(status=status)

    # ---- the step ----------------------------------------------------------------------------
    def _active(self, step: int) -> bool:
        return self.enabled and self._started and not self._closed and self.config.records_step(step)

    def _gather(self, tensors: list[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Full CPU copies of the recorded tensors; every rank gathers, only writers keep."""
        return self._gather_all([(n, t) for n, t in tensors if n in self._recorded_names])

    def _gather_all(self, tensors: list[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return gather_full_cpu(tensors, keep=self._writes)

    def observe(self, output: Any = None, loss: torch.Tensor | float | None = None,
                local_loss: torch.Tensor | float | None = None) -> None:
        """Give the recorder the step's model output and (global) loss; call before optimizer.step()."""
        step = self.step + 1
        if not self._active(step):
            return
        kinds = self.config.kinds
        if output is not None and "outputs" in kinds:
            items = list(flatten_output(output))
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
        kinds = self.config.kinds
        recording = self.config.records_step(step)
        initial = "parameters" in kinds and not self._initial_done
        if initial:
            # step 0: the parameters the first update starts from (after any restore or replay load)
            self._initial_done = True
            initial_params = self._gather(self._params)
            if self._writes:
                self._submit(INITIAL_STEP, {"parameters": initial_params}, complete=False)
        # Local snapshots only (no communication): the gathers of gradients, parameters and deltas
        # happen together after the update, in one collective per mesh and dtype.
        if recording and "gradients" in kinds:
            self._grad_snapshot = [(n, p.grad.detach().clone()) for n, p in self._params
                                   if p.grad is not None and n in self._recorded_names]
        if recording and "deltas" in kinds:
            self._before = [(n, p.detach().clone()) for n, p in self._params if n in self._recorded_names]

    def end_step(self) -> None:
        """After the optimizer update: capture parameters and deltas, and hand the step to the writer."""
        self.capture_after()
        self.finish_step()

    def capture_after(self) -> None:
        """Gather the step's tensors as they are after the update (collectives on sharded tensors).
        Zero-code recording calls it again after each further optimizer of the same training step."""
        if self._in_step and self._active(self.step + 1):
            self._captured = self._capture_after()
        if self._in_step and self._replay is not None and not self._closed:
            # right after the update and its capture, before any next forward: the step taken is
            # the candidate's own; the next one restarts from the reference's state after it
            self._replay.before_step(self.step + 2)

    def finish_step(self) -> None:
        """Count the step and hand its capture to the writer; takes no collective."""
        if not self._in_step:
            return
        self._in_step = False
        self.step += 1
        step = self.step
        captured, self._captured = self._captured, None
        staged, self._staged = self._staged, {}
        self._before = self._grad_snapshot = None
        if captured is not None and self._writes and not self._closed:
            self._submit(step, {**staged, **captured}, complete=True)

    def _capture_after(self) -> dict[str, dict[str, torch.Tensor]]:
        kinds = self.config.kinds
        current = dict(self._params)
        before, grads = self._before or [], self._grad_snapshot or []
        wanted = [("gradients", n, g) for n, g in grads]
        if "parameters" in kinds:
            wanted += [("parameters", n, p) for n, p in self._params if n in self._recorded_names]
        # delta on the local shards, in the parameter's dtype: elementwise, so it equals after - before of the full tensors
        wanted += [("deltas", n, current[n].detach() - b) for n, b in before]
        if "optimizer_state" in kinds:
            chosen = [(n, p) for n, p in self._params if n in self._recorded_names]
            wanted += [("optimizer_state", n, t) for n, t in state_tensors(self.optimizer, chosen)]
        # one batched gather for every kind of the step (sharded state is gathered like parameters)
        full = self._gather_all([(f"{kind}/{n}", t) for kind, n, t in wanted])
        staged: dict[str, dict[str, torch.Tensor]] = {}
        for kind, n, _ in wanted:
            if f"{kind}/{n}" in full:
                staged.setdefault(kind, {})[n] = full[f"{kind}/{n}"]
        return staged

    def _submit(self, step: int, kinds: dict[str, dict[str, torch.Tensor]], complete: bool) -> None:
        writer = self._writer
        nbytes = sum(_nbytes(t) for t in kinds.values())

        def job():
            for kind, tensors in kinds.items():
                writer.write(step, kind, [from_torch(n, t) for n, t in tensors.items()])
            if complete:
                writer.complete_step(step)

        self._bg.submit(job, nbytes)


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
