"""`tracekit show`: what a store holds, at a glance (or as JSON)."""

from __future__ import annotations

import shlex

import click

from tracekit.cli.common import emit_json, json_option, one_line_errors, storage_options
from tracekit.display import shown, terminal_safe

# Run facts in the order a reader looks for them; anything else recorded follows.
_FIRST = ("command", "mode", "device", "backend", "compile_backend", "seed", "world_size", "versions", "env",
          "fallback_ops", "start_time", "end_time", "exit_status", "launcher", "git_commit", "script", "cwd",
          "hostname", "platform", "format_version")


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _value(key: str, v) -> str:
    if key == "command" and isinstance(v, list):
        return shlex.join(str(a) for a in v)
    if isinstance(v, list):
        return ", ".join(str(a) for a in v) if v else "(none)"
    return str(v)


# what an empty selection in `tracekit record`'s configuration means: no filter, so everything
_RECORD_ALL = {"params": [], "ranks": None}


def _record_config_value(key: str, v) -> str:
    return "all" if key in _RECORD_ALL and v == _RECORD_ALL[key] else _value(key, v)


def _run_lines(run: dict, skip=()) -> list[str]:
    keys = [k for k in _FIRST if k in run and k not in skip] + [k for k in run if k not in _FIRST and k not in skip]
    lines = []
    for k in keys:
        v = run[k]
        if isinstance(v, dict):
            lines.append(f"  {k}:" + ("" if v else " (none)"))
            show = _record_config_value if k == "record_config" else _value
            lines += [f"    {kk}: {show(kk, vv)}" for kk, vv in v.items()]
        else:
            lines.append(f"  {k}: {_value(k, v)}")
    return lines


def steps_text(steps: list[int]) -> str:
    """'steps 1-8', 'steps 1-8 (6 steps)' with gaps, 'no steps': a sorted step list in a sentence."""
    return f"steps {_steps(steps[0], steps[-1], len(steps))}" if steps else "no steps"


def _steps(first, last, n) -> str:
    if not n:
        return "none"
    return f"{first}" if first == last else f"{first}-{last}" + ("" if last - first + 1 == n else f" ({n} steps)")


def _mesh_cell(meshes: list[dict]) -> str:
    """A rank's position in each mesh it lives in, each position once: a TP job registers one
    mesh per parallelized module, all the same, which the row used to repeat."""
    positions = (",".join(f"{d}={c}" for d, c in zip(m.get("dim_names") or [], m.get("coordinate") or []))
                 for m in meshes)
    return "; ".join(dict.fromkeys(p for p in positions if p)) or "-"


def _rank_lines(ranks: list[dict]) -> tuple[str, list[str]]:
    """(run-wide coordinates such as dp_degree=2, the table of ranks with the coordinates that vary)."""
    coord_keys = []
    for r in ranks:
        coord_keys += [k for k, v in r["coords"].items()
                       if k not in coord_keys and k not in ("rank", "meshes") and isinstance(v, int)]
    # degrees and the world size are the same on every rank: said once, not in every row
    constant = [k for k in coord_keys if k.endswith(("_degree", "world_size"))
                and len({str(r["coords"].get(k)) for r in ranks}) == 1]
    coord_keys = [k for k in coord_keys if k not in constant]
    header = ["rank", *coord_keys, "mesh", "status", "steps", "bytes"]
    rows = []
    for r in ranks:
        mesh = _mesh_cell(r["coords"].get("meshes") or [])
        rows.append([str(r["rank"]), *[str(r["coords"].get(k, "-")) for k in coord_keys], mesh, r["status"],
                     _steps(r["first_step"], r["last_step"], r["steps_completed"]), human_bytes(r["bytes"])])
    common = " ".join(f"{k}={ranks[0]['coords'][k]}" for k in constant) if ranks else ""
    causes = [f"  rank {r['rank']} {r['status']}: {r['cause']}" for r in ranks if r.get("cause")]
    causes += [f"  rank {r['rank']}: damaged metadata: step(s) {', '.join(map(str, r['completed_without_data']))} "
               "listed as completed hold no data (not counted above; see tracekit verify)"
               for r in ranks if r.get("completed_without_data")]
    return common, _table(header, rows) + causes


def _unwritten_lines(ranks: list[dict]) -> list[str]:
    """One line per rank that completed steps its writer process did not store, with the cause."""
    return [f"  rank {r['rank']} unwritten: {steps_text(r['unwritten_steps'])}"
            + (f" ({r['unwritten_cause']})" if r.get("unwritten_cause") else "")
            for r in ranks if r.get("unwritten_steps")]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    fmt = lambda cells: "  " + "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return [fmt(header), *[fmt(r) for r in rows]]


def _dtype_cell(t: dict) -> str:
    """The recorded dtype, and the one xarray and numpy readers get when it differs (bfloat16)."""
    opens = t.get("opens_as", t["dtype"])
    return t["dtype"] if opens == t["dtype"] else f"{t['dtype']} (opens as {opens})"


def _kind_lines(kinds: list[dict]) -> list[str]:
    lines = []
    for k in kinds:
        steps = k["steps"]
        span = f"steps {steps[0]}-{steps[-1]}" if steps else "no completed steps"
        per_step = sum(t["bytes_per_step"] for t in k["tensors"])
        lines.append(f"  {k['kind']}: {len(k['tensors'])} tensors, {span}, {human_bytes(per_step)} per rank and step")
        rows = [[shown(t["name"]), _dtype_cell(t), "x".join(map(str, t["shape"])) or "scalar",
                 human_bytes(t["bytes_per_step"]), "shape differs over ranks" if t["shapes_differ"] else ""]
                for t in k["tensors"]]
        lines += ["  " + line for line in _table(["tensor", "dtype", "shape", "bytes/step", ""], rows)]
    return lines


def _finished(summary: dict) -> str:
    running = summary.get("running_ranks") or []
    launcherless = summary.get("launcherless")  # recorded through TRACEKIT_STORE: nobody finalizes the store
    if summary["finished"]:
        return f"yes (exit status {summary['run'].get('exit_status')})"
    state = summary.get("job_state")  # from the store's job lock (tracekit.store.ownership)
    if state == "launcher died":
        return "no: launcher died (the job ended without finalizing; ranks keep their completed steps)"
    if state == "recording":
        return "no: still recording (its launcher holds the store)"
    if running:
        return (f"no: rank(s) {_ranges(running)} still running, or died without closing"
                + (" (no launcher)" if launcherless else "; or the launcher died"))
    if launcherless:
        return "every rank closed (no launcher, so no exit status)"
    return "every rank closed, but no launcher finalized the store (no exit status: it is finishing, or died)"


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            out.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ", ".join(out)


def _environment_lines(summary: dict) -> list[str]:
    """The versions and numeric env vars: those every rank shares, then a table of the watched ones
    that differ, each rank that departs from the most common combination flagged with '!'."""
    env = summary.get("environment")
    if not env:
        return []
    same = env["common"]
    lines = ["  same on every rank: " + (", ".join(f"{k}={v}" for k, v in same.items()) or "(nothing recorded)")]
    if env["differs"]:
        names = [d["fact"] for d in env["differs"]]
        by_rank = {str(r["rank"]): tuple(str(d["values"].get(r["rank"], d["values"].get(str(r["rank"])))) for d in env["differs"])
                   for r in summary["ranks"]}
        from collections import Counter

        usual = Counter(by_rank.values()).most_common(1)[0][0]
        rows = [[rank + (" !" if values != usual else ""), *["-" if v == "None" else v for v in values]]
                for rank, values in by_rank.items()]
        flagged = [rank for rank, values in by_rank.items() if values != usual]
        lines += [f"  DIFFERS over ranks ({', '.join(names)}); flagged: rank(s) {', '.join(flagged)}",
                  *["  " + line for line in _table(["rank", *names], rows)]]
    return lines


def _model_lines(summary: dict) -> list[str]:
    """The root model, how many of the optimizer's parameters are recorded, what the output is."""
    from tracekit.inspect.coverage import summary_lines

    lines = summary_lines(summary.get("coverage"))
    if summary.get("loss_derivation"):  # zero-code: the loss is derived from the ranks' local losses
        lines.append(f"  {summary['loss_derivation']}")
    return ["", "model (what the recording covers):", *lines] if lines else []


def _shared_lines(summary: dict) -> list[str]:
    shared = summary.get("bytes_shared_objects")
    if not shared:
        return []
    return [f"  of which shared objects: {human_bytes(shared)} (tensor bytes, stored once per content for all "
            "ranks; not in the ranks' bytes below)"]


_REPLAY_KEYS = ("replay_of", "replay_steps")


def _replay_lines(run: dict) -> list[str]:
    """A replay store (`tracekit record --replay-from`) says so up front, with what it replays."""
    if not run.get("replay_of"):
        return []
    steps = run.get("replay_steps") or ":"
    which = "every step" if steps == ":" else f"steps {steps}"
    return [f"replay of: {run['replay_of']} ({which} restarted from that store's state; docs/REPLAY.md)"]


def _precision_lines(ranks: list[dict]) -> list[str]:
    """The precision context (tracekit/store/precision.py) of each group of ranks that recorded the same one."""
    from tracekit.store.precision import PrecisionContext

    groups: dict[str, list[int]] = {}
    contexts = {}
    for r in ranks:
        key = repr(r.get("precision"))
        groups.setdefault(key, []).append(r["rank"])
        contexts[key] = r.get("precision")
    lines = []
    for key, members in groups.items():
        who = "every rank" if len(groups) == 1 else f"rank(s) {_ranges(members)}"
        if contexts[key] is None:
            lines.append(f"  {who}: not recorded (a store from before tracekit kept it, or the rank ended first)")
            continue
        lines.append(f"  {who}:")
        lines += [f"    {line}" for line in PrecisionContext.from_attrs(contexts[key], "").lines()]
    return lines


def render(summary: dict) -> str:
    common, rank_table = _rank_lines(summary["ranks"])
    per_rank = bool(summary.get("environment"))
    lines = [f"store: {summary['store']}",
             f"size on disk: {human_bytes(summary['bytes_on_disk'])} ({summary['bytes_on_disk']} bytes)",
             *_shared_lines(summary),
             f"finished: {_finished(summary)}",
             *_replay_lines(summary["run"]),
             "", "run:", *_run_lines(summary["run"], skip=(*_REPLAY_KEYS, *(("versions", "env") if per_rank else ()))),
             *(["", "environment (versions and numeric env vars each rank recorded):", *_environment_lines(summary)]
               if per_rank else []),
             *_model_lines(summary),
             "", f"ranks ({summary['world_size']}{'; ' + common if common else ''}):", *rank_table,
             *[f"  rank {r}: listed when the store was finalized, but its group rank_{r}/ is missing "
               "(damaged store; see tracekit verify)" for r in summary.get("missing_ranks", [])],
             *_unwritten_lines(summary["ranks"]),
             "", "precision (what the forward and its reductions computed in):", *_precision_lines(summary["ranks"]),
             "", "kinds:", *_kind_lines(summary["kinds"]),
             *_trace_lines(summary.get("traces") or {}),
             *_trace_damage_lines(summary.get("trace_damage") or [])]
    return terminal_safe("\n".join(lines))


def _trace_lines(traces: dict) -> list[str]:
    """Which steps hold traces of which level (tracekit record --trace); nothing when none do."""
    if not traces:
        return []
    from tracekit.launch.trace_check import traced_line

    return ["", traced_line(traces)]


def _trace_damage_lines(damage: list) -> list[str]:
    """The ranks whose trace step lists could not be read: show names them and goes on."""
    return ([""] if damage else []) + [
        f"rank {d['rank']} traces: {d['problem'].removeprefix('traces: ')} (damaged store; see tracekit verify)"
        for d in damage]


@click.command()
@click.argument("store", type=click.Path())
@json_option("the summary")
@one_line_errors
@storage_options
def show(store, as_json):
    """Summarize STORE: run metadata, ranks and their coordinates, steps, tensors, bytes on disk."""
    from tracekit.inspect.summary import summarize

    summary = summarize(store)
    if as_json:
        emit_json(summary, "-")
    else:
        click.echo(render(summary))
