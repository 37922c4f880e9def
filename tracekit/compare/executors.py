"""Where a diff's comparisons run: one interface the engine chooses an executor by.

An executor compares the plan's steps and yields, in step order, (step, {(pair.key, tensor):
[(start, metrics)]}), calling tick(bytes read) as it goes; closing the generator stops the work
left (a fail-fast diff). Two exist: engine.ThreadExecutor (this process, a thread pool) and
distributed.DaskExecutor (Dask workers, running the engine's worker_task, handed to it). The
engine picks one (--workers, --scheduler); neither imports the engine back.
"""

from __future__ import annotations

from typing import Callable, Generator, Protocol


class Executor(Protocol):
    def compare_steps(self, plan, steps: list[int], tick: Callable[[int], None]) -> Generator[tuple[int, dict], None, None]:
        ...
