"""`tracekit record`: run a training command and record every rank into a store."""

import sys

import click

from tracekit.cli.show import steps_text
from tracekit.cli.common import CommandError, emit_json_line, json_option, one_line_errors, storage_options
from tracekit.errors import UsageError
from tracekit.inspect.coverage import count_phrase, from_summary, left_out_line
from tracekit.store.kinds import TRACE_LEVELS, TRACE_TABLE
from tracekit.launch import (RECORDABLE_KINDS, DEFAULT_FLUSH_TIMEOUT, DEFAULT_QUEUE_MB, DEFAULT_WRITER_NICE, MAX_NICE, RecordConfig,
                             parse_kinds, parse_ranks, parse_seconds, parse_step_range, record_job)
from tracekit.launch.config import RankSet


class _RecordCommand(click.Command):
    """`record`, with a hint for the commonest slip: the recorded command's options before `--`."""

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as e:
            if "--" not in args:
                e.message = (f"{e.message} The command to record goes after --, e.g. "
                             "tracekit record -o runs/ref -- torchrun --standalone --nproc-per-node=4 train.py")
                e.possibilities = None
            raise


def summary_line(done: dict, status: int, traced: bool = False) -> str:
    """One line: what the store holds and how the run ended (traced: --trace was given)."""
    from tracekit.cli.show import human_bytes
    from tracekit.launch import traced_line

    ranks = ", ".join(f"{n} {s}" for s, n in sorted(done["statuses"].items())) or "none"
    traces = f"; {traced_line(done.get('traces') or {})}" if traced or done.get("traces") else ""
    return (f"tracekit record: {done['ranks']} rank(s), {steps_text(done['steps'])}, "
            f"kinds {', '.join(done['kinds']) or 'none'}, {_coverage(done)}{human_bytes(done['bytes'])} in {done['store']}{traces}; "
            f"ranks: {ranks}{_unwritten(done.get('unwritten') or {})}; exit status {status}")


def _unwritten(unwritten: dict) -> str:
    """'; unwritten: rank 1 steps 3-8 (why)' for the ranks whose writer did not store every step."""
    if not unwritten:
        return ""
    return "; unwritten: " + ", ".join(f"rank {r} {steps_text(u['steps'])}" + (f" ({u['cause']})" if u.get("cause") else "")
                                       for r, u in sorted(unwritten.items()))


def _coverage(done: dict) -> str:
    """'45 of 45 optimizer parameters, global loss = mean over dp ranks (...), ' (each only when stored)."""
    cov = from_summary(done.get("coverage"))
    loss = f"{done['loss_derivation']}, " if done.get("loss_derivation") else ""  # zero-code: how it was chosen
    return (f"{count_phrase(cov)}, " if cov is not None else "") + loss


def recording_failed_lines(done: dict) -> list[str]:
    """A line per cause for the ranks whose writer process failed to store their steps: with the steps
    held until training ends (--hold-mb), the rank itself may have ended before it could hear of it."""
    by_cause: dict[str, list[int]] = {}
    for rank, cause in sorted((done.get("recording_failed") or {}).items()):
        by_cause.setdefault(cause, []).append(rank)
    return [f"tracekit record: {'rank' if len(ranks) == 1 else 'ranks'} {RankSet.of(ranks).spec()}: recording failed: {cause}"
            for cause, ranks in by_cause.items()]


def left_out_lines(done: dict) -> list[str]:
    """Below full coverage: which optimizer parameters the recording left out, and why."""
    cov = from_summary(done.get("coverage"))
    if cov is None or cov.complete:
        return []
    return [f"tracekit record: warning: {left_out_line(cov)}; see docs/ZEROCODE.md (--model, --strict)"]


@click.command(cls=_RecordCommand, context_settings={"ignore_unknown_options": False})
@click.option("-o", "--output", "store", required=True, type=click.Path(), help="Store to create: a directory, or a URL such as s3://bucket/runs/ref.")
@click.option("--force", is_flag=True, help="Overwrite an existing tracekit store at OUTPUT.")
@click.option("--kinds", default=None, metavar="LIST",
              help=f"Kinds to record: a list replaces the defaults, +KIND/-KIND edits them. Known: {', '.join(RECORDABLE_KINDS)}.")
@click.option("--params", "param_globs", multiple=True, metavar="GLOB",
              help="Record only parameters whose name matches GLOB (repeatable), e.g. 'layers.0.*'.")
@click.option("--full", "full", multiple=True, metavar="GLOB",
              help="Keep the bytes only of tensors whose name matches GLOB, or KIND:GLOB for one kind "
                   "(repeatable or comma-separated, e.g. 'loss:*,parameters:*'); the others keep only their "
                   "summary (min, max, mean, L2, NaN/Inf counts) and hash. Default: every tensor's bytes. See docs/FORMAT.md.")
@click.option("--ranks", default=None, metavar="LIST", help="Ranks that write, e.g. 0,2-3 (all ranks still gather). Default: all.")
@click.option("--every", default=1, show_default=True, type=click.IntRange(min=1), help="Record every k-th step (k, 2k, ...).")
@click.option("--queue-mb", default=DEFAULT_QUEUE_MB, show_default=True, type=click.IntRange(min=1),
              help="Per rank, at most this many MB of handed-off steps wait for the rank's writer process.")
@click.option("--hold-mb", default=None, type=click.IntRange(min=0), metavar="MB",
              help="Per rank, up to this many MB of handed-off steps wait in the spool while the rank trains; the "
                   "writer process stores them once training ends, when it no longer takes cores from the ranks "
                   "(past it, the oldest are stored meanwhile, down to half of it, several steps at once). "
                   "Default: half of --queue-mb; 0 stores each step as it comes. See docs/RELIABILITY.md.")
@click.option("--writer-nice", default=DEFAULT_WRITER_NICE, show_default=True, type=click.IntRange(0, MAX_NICE),
              help="Nice value of each rank's writer process while the rank trains: at 19 the kernel runs it mostly on cores "
                   "the training leaves idle, and the queue cap bounds what waits meanwhile; 0 runs it beside "
                   "the ranks. Back to the starting value (where permitted) once the rank is done.")
@click.option("--flush-timeout", default=str(DEFAULT_FLUSH_TIMEOUT), show_default=True, metavar="SECONDS",
              help="Once a rank's training ends (or after a signal), wait at most this long for its writer process "
                   "to store its spooled steps; then stop it, listing what it did not store. See docs/RELIABILITY.md.")
@click.option("--replay-from", "replay_from", default=None, metavar="REF", type=click.Path(),
              help="Replay: start each step from REF's recorded state (parameters, and optimizer state if REF has it), "
                   "so each step's error is its own. See docs/REPLAY.md.")
@click.option("--replay-steps", default=None, metavar="A:B",
              help="With --replay-from: replay only steps A to B (A:, :B leave an end open). Default: all.")
@click.option("--zero-code/--no-zero-code", default=True, show_default=True,
              help="Record scripts that do not use tracekit's Recorder (a bootstrap on PYTHONPATH). See docs/ZEROCODE.md.")
@click.option("--strict", is_flag=True, help="Fail the job if zero-code recording cannot instrument it (default: warn once, go on).")
@click.option("--optimizer", "optimizer_name", default=None, metavar="CLASS",
              help="Zero-code: the training optimizer's class name, when the first one stepped after backward() is not it.")
@click.option("--model", "model_name", default=None, metavar="NAME",
              help="Zero-code: the root model, when the guess (the called module owning all the optimizer's parameters) "
                   "cannot decide: a class name (Llama3Model) or an attribute path below a called module (encoder).")
@click.option("--loss-reduction", type=click.Choice(["auto", "mean", "sum"]), default="auto", show_default=True,
              help="Zero-code: how the data-parallel ranks' local losses make the global loss. sum: for scripts "
                   "that divide each rank's loss by the dp degree or the global token count; mean: DDP's. auto: sum "
                   "where TorchTitan's trainer takes the optimizer step (it divides by the global token count), "
                   "else mean, and the record line says which. See docs/ZEROCODE.md.")
@click.option("--trace", "trace", type=click.Choice(list(TRACE_LEVELS)), default=None,
              help="Trace the chosen steps: " + "; ".join(f"{t.name}: {t.what}" for t in TRACE_TABLE)
                   + ". See docs/LOCATE.md.")
@click.option("--trace-steps", default=None, metavar="K[:L]",
              help="With --trace: the traced steps (default: the first whole step, 1 with tracekit's Recorder, "
                   "2 zero-code, which starts inside step 1). A step asked for and not traced is an error.")
@click.option("--trace-full", "trace_full", multiple=True, metavar="GLOB",
              help="With --trace: keep whole tensors (not only summaries) of events whose label PHASE:MODULE:OP#CALL "
                   "matches GLOB (repeatable), e.g. 'fwd:0:*'.")
@json_option("what was recorded", "The closing summary stays on stderr. Schema: schemas/record-result.schema.json.",
             where="as one line, the last on stdout, after the command's own output")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@one_line_errors
@storage_options
def record(store, force, kinds, param_globs, full, ranks, every, queue_mb, hold_mb, writer_nice, flush_timeout, replay_from, replay_steps, zero_code, strict,
           optimizer_name, model_name, loss_reduction, trace, trace_steps, trace_full, as_json, command):
    """Run COMMAND (usually torchrun ...) and record what every rank computes into STORE.

    \b
    Example (a CPU reference of the FSDP sample on 4 ranks; the script never imports tracekit):
      tracekit record -o runs/ref -- torchrun --standalone --nproc-per-node=4 \\
          samples/plain/train.py --parallelism fsdp --device cpu --backend gloo

    The store is created before the command starts; workers find it through TRACEKIT_* environment
    variables. The exit status is the command's; the store then records the end time, the exit
    status and which steps each rank completed (a crashed rank keeps its completed steps readable).
    """
    flush_timeout = parse_seconds(flush_timeout)  # nan, inf and negatives refused: every wait ends
    config = RecordConfig(store=store, flush_timeout=flush_timeout, kinds=parse_kinds(kinds), params=tuple(param_globs),
                          ranks=parse_ranks(ranks), every=every, queue_mb=queue_mb, hold_mb=hold_mb,
                          writer_nice=writer_nice,
                          replay_from=replay_from, replay_steps=parse_step_range(replay_steps),
                          trace=trace, trace_steps=parse_step_range(trace_steps) if trace_steps else None,
                          trace_full=tuple(trace_full), full=tuple(full))
    if (trace_steps or trace_full) and not trace:
        raise UsageError("--trace-steps and --trace-full need --trace modules|ops")
    if replay_steps and not replay_from:
        raise UsageError("--replay-steps needs --replay-from REF")
    if model_name and not zero_code:
        raise UsageError("--model names the model zero-code recording follows; with --no-zero-code, the script's "
                         "Recorder(model, ...) names it")
    status = record_job(list(command), config, force=force, zero_code=zero_code, strict=strict, optimizer=optimizer_name,
                        model=model_name, loss_reduction=loss_reduction, flush_timeout=flush_timeout)
    from tracekit.inspect.summary import recording_summary

    done = recording_summary(store)
    for line in [*recording_failed_lines(done), *left_out_lines(done)]:
        click.echo(line, err=True)
    click.echo(summary_line(done, status, traced=bool(trace)), err=True)
    from tracekit.launch import untraced_problem

    problems = [p for p in (untraced_problem(config, done["steps"], done["traces"]),
                            _nothing_recorded(done, config, ranks), _nothing_replayed(done, replay_from, replay_steps))
                if p is not None]
    if as_json:
        emit_json_line(result_object(done, status, problems))
    for problem in problems:
        if status == 0:  # a run that "succeeded" without what was asked must not pass in CI
            raise CommandError(problem)
        click.echo(f"Error: {problem}", err=True)
    sys.exit(status)


def result_object(done: dict, status: int, problems: list[str]) -> dict:
    """`record --json`'s object (schemas/record-result.schema.json): recording_summary's facts, the
    command's exit status, and the problems also reported as `Error:` lines."""
    return {"store": done["store"], "ranks": done["ranks"], "steps": done["steps"], "kinds": done["kinds"],
            "bytes": done["bytes"], "statuses": done["statuses"], "coverage": done.get("coverage"),
            "unwritten": {str(r): u for r, u in sorted((done.get("unwritten") or {}).items())},
            "traces": done.get("traces") or {}, "replayed_steps": done.get("replayed_steps"),
            "exit_status": status, "errors": problems}


def _nothing_recorded(done: dict, config: RecordConfig, ranks) -> str | None:
    """Why the store holds no step, or None when it holds some."""
    if done["steps"]:
        return None
    why = (f"--ranks {ranks} matched no rank of the job" if config.ranks is not None and not done["ranks"] else
           ("no rank started recording (did the command run a training script? a rank whose writer process "
            "failed as it started says why above)") if not done["ranks"] else
           "the ranks' writer processes stored none of the steps the ranks completed (unwritten, above)"
           if done.get("unwritten") else
           "no rank completed a step (steps are recorded when the training optimizer steps)")
    return f"nothing was recorded in {config.store}: {why}; see docs/ZEROCODE.md"


def _nothing_replayed(done: dict, replay_from, replay_steps) -> str | None:
    """A replay that replayed nothing (None: not a replay, or it replayed steps, or nothing was recorded at all)."""
    if not replay_from or not done["steps"] or done.get("replayed_steps"):
        return None
    return (f"no step was replayed from {replay_from} (--replay-steps {replay_steps or '1:'}; "
            f"this run recorded {steps_text(done['steps'])})")
