"""`tracekit show`: what a store holds, at a glance (or as JSON)."""

from __future__ import annotations

import shlex

import click

from tracekit.cli.common import emit_json, one_line_errors
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


def _run_lines(run: dict) -> list[str]:
    keys = [k for k in _FIRST if k in run] + [k for k in run if k not in _FIRST]
    lines = []
    for k in keys:
        v = run[k]
        if isinstance(v, dict):
            lines.append(f"  {k}:" + ("" if v else " (none)"))
            lines += [f"    {kk}: {_value(kk, vv)}" for kk, vv in v.items()]
        else:
            lines.append(f"  {k}: {_value(k, v)}")
    return lines


def _steps(first, last, n) -> str:
    if not n:
        return "none"
    return f"{first}" if first == last else f"{first}-{last}" + ("" if last - first + 1 == n else f" ({n} steps)")


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
        meshes = r["coords"].get("meshes") or []
        mesh = "; ".join(
            ",".join(f"{d}={c}" for d, c in zip(m.get("dim_names") or [], m.get("coordinate") or [])) for m in meshes
        ) or "-"
        rows.append([str(r["rank"]), *[str(r["coords"].get(k, "-")) for k in coord_keys], mesh, r["status"],
                     _steps(r["first_step"], r["last_step"], r["steps_completed"]), human_bytes(r["bytes"])])
    common = " ".join(f"{k}={ranks[0]['coords'][k]}" for k in constant) if ranks else ""
    return common, _table(header, rows)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    fmt = lambda cells: "  " + "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return [fmt(header), *[fmt(r) for r in rows]]


def _kind_lines(kinds: list[dict]) -> list[str]:
    lines = []
    for k in kinds:
        steps = k["steps"]
        span = f"steps {steps[0]}-{steps[-1]}" if steps else "no completed steps"
        per_step = sum(t["bytes_per_step"] for t in k["tensors"])
        lines.append(f"  {k['kind']}: {len(k['tensors'])} tensors, {span}, {human_bytes(per_step)} per rank and step")
        rows = [[shown(t["name"]), t["dtype"], "x".join(map(str, t["shape"])) or "scalar",
                 human_bytes(t["bytes_per_step"]), "shape differs over ranks" if t["shapes_differ"] else ""]
                for t in k["tensors"]]
        lines += ["  " + line for line in _table(["tensor", "dtype", "shape", "bytes/step", ""], rows)]
    return lines


def _unfinished(summary: dict) -> str:
    state = summary.get("job_state")
    if state == "launcher died":
        return "no: launcher died (the job ended without finalizing; ranks keep their completed steps)"
    if state == "recording":
        return "no (still recording)"
    return "no (recorded without a launcher; see each rank's status)"


def render(summary: dict) -> str:
    common, rank_table = _rank_lines(summary["ranks"])
    lines = [f"store: {summary['store']}",
             f"size on disk: {human_bytes(summary['bytes_on_disk'])} ({summary['bytes_on_disk']} bytes)",
             f"finished: {'yes' if summary['finished'] else _unfinished(summary)}",
             "", "run:", *_run_lines(summary["run"]),
             "", f"ranks ({summary['world_size']}{'; ' + common if common else ''}):", *rank_table,
             "", "kinds:", *_kind_lines(summary["kinds"])]
    return terminal_safe("\n".join(lines))


@click.command()
@click.argument("store", type=click.Path())
@click.option("--json", "json_dest", is_flag=False, flag_value="-", default=None, metavar="[FILE]",
              help="Print the summary as JSON (to FILE if given, else stdout).")
@one_line_errors
def show(store, json_dest):
    """Summarize STORE: run metadata, ranks and their coordinates, steps, tensors, bytes on disk."""
    from tracekit.inspect.summary import summarize

    summary = summarize(store)
    if json_dest is not None:
        emit_json(summary, json_dest)
    else:
        click.echo(render(summary))
