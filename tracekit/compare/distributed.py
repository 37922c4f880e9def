"""The diff on dask.distributed (an Executor, compare/executors.py): the same units of work,
dispatched to worker processes.

Work is split by (rank pair, kind, step range): one task compares every unit of one KindPair over
a run of consecutive steps. A worker opens the stores itself (from their Location: a folder all
workers see, or a URL with its storage options) and reads only the bytes of its task, piece by
piece as the one-process engine does, so its memory is a few read buffers plus one small metrics
accumulator per tensor part, whatever the store size. It sends back those accumulators; this process
merges them exactly as the one-process diff merges its threads' (same units, same order), so the
report is the same.

Storage options (credentials included) travel to the workers inside the task, as Dask pickles
it; on a shared cluster prefer credentials the workers get from their own AWS chain.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Callable

from tracekit.errors import UsageError

# Tasks per worker: enough to even out uneven pairs, few enough that scheduling costs little.
TASKS_PER_WORKER = 4


@dataclass(frozen=True)
class DiffSpec:
    """What a worker needs to rebuild the engine and plan of one diff."""

    token: str
    ref: object  # Location
    cand: object
    oracle: object | None
    align: str
    kinds: list[str] | None
    tolerances: object  # Tolerances
    equal_nan: bool
    oracle_factor: float | None
    trust_index: bool = True

    @classmethod
    def of(cls, refc, candc, orac, align, kinds, tolerances, equal_nan, oracle_factor, trust_index=True) -> "DiffSpec":
        return cls(uuid.uuid4().hex, refc.store.location, candc.store.location,
                   orac.store.location if orac is not None else None, align, list(kinds) if kinds else None,
                   tolerances, equal_nan, oracle_factor, trust_index)


def step_ranges(steps: list[int], n_pairs: int, slots: int) -> list[list[int]]:
    """Consecutive runs of steps, so that about TASKS_PER_WORKER tasks per slot exist in all."""
    per_range = max(1, -(-len(steps) * n_pairs // max(1, slots * TASKS_PER_WORKER)))
    return [steps[i : i + per_range] for i in range(0, len(steps), per_range)]


SCHEDULER_CONNECT_TIMEOUT_S = 10  # how long `--scheduler ADDRESS` waits for the scheduler to answer


def _client(workers: int | None, scheduler: str | None):
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise UsageError("--workers/--scheduler need dask.distributed: pip install 'tracekit[cluster]'") from None
    # set_as_default=False: the diff uses its client explicitly, and a default one would take every
    # later dask computation of the process, the user's and tracekit.open's included; a client that
    # failed to connect ("bogus") stays registered as the default, and those computations then hang
    if scheduler is not None:
        try:
            return Client(scheduler, timeout=f"{SCHEDULER_CONNECT_TIMEOUT_S}s", set_as_default=False), None
        except (OSError, TimeoutError, ValueError) as e:  # ValueError: not an address ("bogus": no port)
            raise UsageError(f"--scheduler {scheduler}: cannot connect ({e.__class__.__name__}: {e})") from None
    # one thread per worker process: one task, so one task's buffers, in memory per worker at a time
    cluster = LocalCluster(n_workers=int(workers), threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address="127.0.0.1:0", silence_logs=50)
    return Client(cluster, set_as_default=False), cluster


class DaskExecutor:
    """Runs `task(spec, pair_index, steps)` -> {step: ([(tensor, start, metrics)], bytes read)} on
    Dask workers: a local cluster of `workers` processes, or the one at `scheduler`. The task is
    the engine's (engine.worker_task), handed in, so this module never imports the engine."""

    def __init__(self, spec: DiffSpec, task: Callable, workers: int | None, scheduler: str | None):
        self.spec, self.task, self.workers, self.scheduler = spec, task, workers, scheduler

    def compare_steps(self, plan, steps: list[int], tick: Callable[[int], None]):
        """Yields (step, {(pair.key, tensor): [(start, metrics)]}) in step order, like the one-process engine."""
        spec = self.spec
        client, cluster = _client(self.workers, self.scheduler)
        futures = []
        try:
            pairs = [(i, kp) for i, kp in enumerate(plan.pairs) if kp.tensors]
            slots = sum(client.nthreads().values()) or 1
            ranges = step_ranges(steps, len(pairs), slots)
            by_range = []
            for rng in ranges:
                batch = [(kp, client.submit(self.task, spec, i, rng, pure=False, key=f"tracekit-diff-{spec.token}-{i}-{rng[0]}"))
                         for i, kp in pairs if set(rng) & set(kp.steps)]
                futures += [f for _, f in batch]
                by_range.append((rng, batch))
            for rng, batch in by_range:
                done = [(kp, f.result()) for kp, f in batch]
                for step in rng:
                    partial: dict[tuple[int, str], list] = {}
                    nbytes = 0
                    for kp, result in done:
                        parts, n = result.get(step, ([], 0))
                        for name, start, acc in parts:
                            partial.setdefault((kp.key, name), []).append((start, acc))
                        nbytes += n
                    tick(nbytes)
                    yield step, partial
        finally:
            for f in futures:
                f.cancel()
            client.close()
            if cluster is not None:
                cluster.close()
