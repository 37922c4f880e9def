"""What to record, as a typed config that travels from `tracekit record` to the workers in env vars."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace

from tracekit.store.location import canonical
from tracekit.errors import UsageError
from tracekit.store.keep import parse_full
from tracekit.store.kinds import DEFAULT_KINDS, KINDS, TRACE_LEVELS
from tracekit.store.ownership import ENV_RUN_ID
from tracekit.writer.priority import MAX_NICE

ENV_STORE = "TRACEKIT_STORE"
ENV_KINDS = "TRACEKIT_KINDS"
ENV_PARAMS = "TRACEKIT_PARAMS"
ENV_RANKS = "TRACEKIT_RANKS"
ENV_EVERY = "TRACEKIT_EVERY"
ENV_QUEUE_MB = "TRACEKIT_QUEUE_MB"
ENV_HOLD_MB = "TRACEKIT_HOLD_MB"
ENV_WRITER_NICE = "TRACEKIT_WRITER_NICE"
ENV_REPLAY_FROM = "TRACEKIT_REPLAY_FROM"
ENV_REPLAY_STEPS = "TRACEKIT_REPLAY_STEPS"
ENV_TRACE = "TRACEKIT_TRACE"
ENV_TRACE_STEPS = "TRACEKIT_TRACE_STEPS"
ENV_TRACE_FULL = "TRACEKIT_TRACE_FULL"
ENV_FULL = "TRACEKIT_FULL"  # --full patterns, one a line
ENV_FLUSH_TIMEOUT = "TRACEKIT_FLUSH_TIMEOUT"  # seconds a rank waits for its writer once training ends

RECORDABLE_KINDS = KINDS  # every registered kind
DEFAULT_QUEUE_MB = 1024
DEFAULT_WRITER_NICE = MAX_NICE  # the writer yields the cores to training (tracekit/writer/priority.py)
DEFAULT_FLUSH_TIMEOUT = 60.0


def parse_seconds(spec, what: str = "--flush-timeout") -> float:
    """A duration in seconds: finite and not negative. nan would compare false with every bound
    (a wait that never ends), inf is no bound at all."""
    try:
        value = float(spec)
    except (TypeError, ValueError):
        raise UsageError(f"{what} {spec!r}: expected a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"{what} {spec!r}: expected a finite number of seconds, 0 or more")
    return value


def parse_kinds(spec: str | None) -> tuple[str, ...]:
    """'outputs,loss' replaces the defaults; '+local_loss,-outputs' edits them."""
    if not spec:
        return DEFAULT_KINDS
    items = [s.strip() for s in spec.split(",") if s.strip()]
    if not items:
        raise UsageError(f"kinds {spec!r}: names no kind; known kinds: {', '.join(RECORDABLE_KINDS)}")
    if all(s[0] in "+-" for s in items):
        kinds = list(DEFAULT_KINDS)
        for s in items:
            name = s[1:]
            _check_kind(name)
            if s[0] == "+" and name not in kinds:
                kinds.append(name)
            elif s[0] == "-" and name in kinds:
                kinds.remove(name)
        if not kinds:  # recording nothing would look like recording everything's defaults failed
            raise UsageError(f"kinds {spec!r}: leaves no kind to record; known kinds: {', '.join(RECORDABLE_KINDS)}")
        return tuple(kinds)
    if any(s[0] in "+-" for s in items):
        raise UsageError(f"kinds {spec!r}: either list kinds or edit the defaults with +/-, not both")
    for s in items:
        _check_kind(s)
    return tuple(items)


def _check_kind(name: str) -> None:
    if name not in RECORDABLE_KINDS:
        raise UsageError(f"unknown kind {name!r}; known kinds: {', '.join(RECORDABLE_KINDS)}")


class RankSet:
    """A set of ranks kept as its ranges, so --ranks 0-99999999999999 costs two numbers, not 10^14."""

    def __init__(self, ranges):
        merged: list[list[int]] = []
        for lo, hi in sorted(ranges):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        self.ranges = tuple((lo, hi) for lo, hi in merged)

    @classmethod
    def of(cls, ranks) -> "RankSet":
        """From a RankSet or any collection of rank numbers."""
        return ranks if isinstance(ranks, RankSet) else cls((r, r) for r in ranks)

    def __contains__(self, rank) -> bool:
        return any(lo <= rank <= hi for lo, hi in self.ranges)

    def __eq__(self, other) -> bool:
        return isinstance(other, RankSet) and self.ranges == other.ranges

    def __hash__(self) -> int:
        return hash(self.ranges)

    def spec(self) -> str:
        """'0,2-3': what parse_ranks reads back."""
        return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in self.ranges)

    def from_rank(self, first: int) -> "RankSet":
        """The ranks from `first` on (those outside a world of `first` ranks)."""
        return RankSet((max(lo, first), hi) for lo, hi in self.ranges if hi >= first)

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def __repr__(self) -> str:
        return f"RankSet({self.spec()!r})"


def parse_ranks(spec: str | None) -> RankSet | None:
    """'0,2-3' -> ranks {0, 2, 3}; empty -> None (all ranks). Ranges go up (3-1 is refused, not empty)."""
    if spec is None or spec == "":
        return None
    ranges = []
    for part in spec.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if not (lo.strip().isdigit() and (not sep or hi.strip().isdigit())):
            raise UsageError(f"ranks {spec!r}: expected a list of ranks and ranges like 0,2-3 (ranks count from 0)")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise UsageError(f"ranks {spec!r}: range {part} goes down; write {last}-{first}")
        ranges.append((first, last))
    return RankSet(ranges)


def parse_step_range(spec: str | None) -> tuple[int, int | None]:
    """'A:B' -> (A, B) inclusive; 'A:' or ':B' leave an end open (None: no last step); 'A' is A:A."""
    if not spec or not spec.strip():
        return (1, None)
    lo_s, sep, hi_s = spec.strip().partition(":")
    try:
        lo = int(lo_s) if lo_s.strip() else 1
        hi = (int(hi_s) if hi_s.strip() else None) if sep else lo
    except ValueError:
        raise UsageError(f"steps {spec!r}: expected A:B, A: or :B with step numbers (steps count from 1)") from None
    if lo < 1 or (hi is not None and hi < lo):
        raise UsageError(f"steps {spec!r}: need 1 <= A <= B (steps count from 1)")
    return (lo, hi)


def parse_trace_level(spec: str | None) -> str | None:
    if not spec:
        return None
    if spec not in TRACE_LEVELS:
        raise UsageError(f"trace level {spec!r}: use one of {', '.join(TRACE_LEVELS)}")
    return spec


def first_trace_step(zero_code: bool) -> int:
    """The first step a recorder can trace whole: zero-code recording hooks in at the first
    optimizer step, inside step 1, so its first whole step is 2."""
    return 2 if zero_code else 1


def format_step_range(steps: tuple[int, int | None]) -> str:
    return f"{steps[0]}:{'' if steps[1] is None else steps[1]}"


@dataclass(frozen=True)
class RecordConfig:
    store: str | None = None  # None: recording is off and the recorder is a pass-through
    kinds: tuple[str, ...] = DEFAULT_KINDS
    params: tuple[str, ...] = ()  # fnmatch globs over parameter names; empty: all
    ranks: RankSet | None = None  # None: every rank writes (any collection of ranks is taken)
    every: int = 1  # record steps k, 2k, 3k, ... (the initial parameters always)
    queue_mb: int = DEFAULT_QUEUE_MB  # cap on sealed steps spooled for the rank's writer process
    # sealed steps the writer process leaves in the spool while the rank trains, stored once training
    # ends (or the rank needs the room): None, half the queue; 0, each step stored as it comes
    hold_mb: int | None = None
    writer_nice: int = DEFAULT_WRITER_NICE  # the writer process's nice value while the rank trains, 0-19
    replay_from: str | None = None  # a reference store: each replayed step starts from its state
    replay_steps: tuple[int, int | None] = (1, None)  # replayed steps, inclusive (None: to the end)
    run_id: str | None = None  # the job's run id, set by `tracekit record`; ranks write only under it
    trace: str | None = None  # "modules" or "ops": trace the chosen steps at that level
    # traced steps, inclusive; None: the first whole step the recorder sees (step 1 with an
    # explicit Recorder, step 2 zero-code, which starts inside step 1: see first_trace_step)
    trace_steps: tuple[int, int | None] | None = None
    trace_full: tuple[str, ...] = ()  # fnmatch globs over event labels whose tensors are kept whole
    # tensors that keep their bytes: GLOB or KIND:GLOB (tracekit/store/keep.py); empty: all of them.
    # The others keep only their summary and hash (format 2 stores).
    full: tuple[str, ...] = ()
    # how long a rank waits, once its training ended, for its writer process to store what is spooled
    flush_timeout: float = DEFAULT_FLUSH_TIMEOUT
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.every < 1:
            raise UsageError(f"every must be at least 1, got {self.every}")
        if self.queue_mb < 1:
            raise UsageError(f"queue size must be at least 1 MB, got {self.queue_mb}")
        if self.hold_mb is not None and not 0 <= self.hold_mb <= self.queue_mb:
            raise UsageError(f"hold size (--hold-mb) must be 0 to the queue size (--queue-mb, {self.queue_mb}), got {self.hold_mb}")
        if not 0 <= self.writer_nice <= MAX_NICE:
            raise UsageError(f"writer nice value must be 0 to {MAX_NICE}, got {self.writer_nice}")
        object.__setattr__(self, "full", parse_full(self.full))  # checked, commas split, once
        if self.ranks is not None:
            object.__setattr__(self, "ranks", RankSet.of(self.ranks))
        object.__setattr__(self, "flush_timeout", parse_seconds(self.flush_timeout))

    @classmethod
    def from_env(cls, environ=None) -> "RecordConfig":
        env = os.environ if environ is None else environ
        try:
            every = int(env.get(ENV_EVERY, "1"))
            queue_mb = int(env.get(ENV_QUEUE_MB, str(DEFAULT_QUEUE_MB)))
            hold_mb = int(env[ENV_HOLD_MB]) if env.get(ENV_HOLD_MB) else None
            writer_nice = int(env.get(ENV_WRITER_NICE, str(DEFAULT_WRITER_NICE)))
        except ValueError as e:
            raise UsageError(f"bad tracekit setting in the environment: {e}") from None
        return cls(
            store=env.get(ENV_STORE) or None,
            kinds=parse_kinds(env.get(ENV_KINDS)),
            params=tuple(p for p in env.get(ENV_PARAMS, "").split(",") if p),
            ranks=parse_ranks(env.get(ENV_RANKS)),
            every=every,
            queue_mb=queue_mb,
            hold_mb=hold_mb,
            writer_nice=writer_nice,
            replay_from=env.get(ENV_REPLAY_FROM) or None,
            replay_steps=parse_step_range(env.get(ENV_REPLAY_STEPS)),
            run_id=env.get(ENV_RUN_ID) or None,
            trace=parse_trace_level(env.get(ENV_TRACE)),
            trace_steps=parse_step_range(env[ENV_TRACE_STEPS]) if env.get(ENV_TRACE_STEPS) else None,
            trace_full=tuple(g for g in env.get(ENV_TRACE_FULL, "").split("\n") if g),
            full=tuple(g for g in env.get(ENV_FULL, "").split("\n") if g),
            flush_timeout=parse_seconds(env.get(ENV_FLUSH_TIMEOUT, DEFAULT_FLUSH_TIMEOUT), ENV_FLUSH_TIMEOUT),
        )

    def to_env(self) -> dict[str, str]:
        env = {ENV_KINDS: ",".join(self.kinds), ENV_EVERY: str(self.every), ENV_QUEUE_MB: str(self.queue_mb),
               ENV_WRITER_NICE: str(self.writer_nice), ENV_FLUSH_TIMEOUT: repr(self.flush_timeout)}
        if self.store:
            env[ENV_STORE] = canonical(self.store)
        if self.hold_mb is not None:
            env[ENV_HOLD_MB] = str(self.hold_mb)
        if self.params:
            env[ENV_PARAMS] = ",".join(self.params)
        if self.ranks is not None:
            env[ENV_RANKS] = self.ranks.spec()
        if self.run_id:
            env[ENV_RUN_ID] = self.run_id
        if self.replay_from:
            env[ENV_REPLAY_FROM] = canonical(self.replay_from)
            env[ENV_REPLAY_STEPS] = format_step_range(self.replay_steps)
        if self.full:
            env[ENV_FULL] = "\n".join(self.full)
        if self.trace:
            env[ENV_TRACE] = self.trace
            if self.trace_steps is not None:
                env[ENV_TRACE_STEPS] = format_step_range(self.trace_steps)
            if self.trace_full:
                env[ENV_TRACE_FULL] = "\n".join(self.trace_full)
        return env

    @property
    def hold_bytes(self) -> int:
        return (self.queue_mb // 2 if self.hold_mb is None else self.hold_mb) * 1024 * 1024

    def with_store(self, store: str | None) -> "RecordConfig":
        return replace(self, store=store)

    def records_step(self, step: int) -> bool:
        return step % self.every == 0

    def with_trace_default(self, zero_code: bool) -> "RecordConfig":
        """trace_steps resolved: None becomes the first whole step this recorder sees."""
        if self.trace is None or self.trace_steps is not None:
            return self
        first = first_trace_step(zero_code)
        return replace(self, trace_steps=(first, first))

    def traces_step(self, step: int) -> bool:
        lo, hi = self.trace_steps or (1, 1)
        return self.trace is not None and step >= lo and (hi is None or step <= hi)

    def traces_after(self, step: int) -> bool:
        """Whether any step after `step` is still to be traced."""
        hi = (self.trace_steps or (1, 1))[1]
        return self.trace is not None and (hi is None or hi > step)
