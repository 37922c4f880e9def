"""The environment facts a parity hunt checks first: package versions and numeric environment
variables, per rank, and which of them differ between ranks or between two runs.

Each rank records its own `versions` and numeric `env` (tracekit.environment); a store without
them (an older one, or an imported one) falls back to the run's (the launcher's) facts.
"""

from __future__ import annotations

# Versions whose difference changes numerics; the rest (numpy, zarr, ...) are shown, never flagged.
WATCHED_VERSIONS = ("torch", "torch-neuronx", "neuronx-cc")


def rank_facts(store) -> dict[int, dict[str, dict[str, str]]]:
    """{rank: {"versions": {package: version}, "env": {VAR: value}}} of an opened RunStore."""
    run_versions, run_env = dict(store.run_meta.versions), dict(store.run_meta.env)
    out = {}
    for r in store.ranks:
        meta = store.rank(r).meta
        out[r] = {"versions": dict(meta.versions) if meta.versions is not None else run_versions,
                  "env": dict(meta.env) if meta.env is not None else run_env}
    return out


def watched(facts: dict[str, dict[str, str]]) -> dict[str, str | None]:
    """The flagged facts of one rank, flat: watched versions by package name, env vars by name."""
    versions = facts.get("versions") or {}
    return {**{p: versions.get(p) for p in WATCHED_VERSIONS}, **(facts.get("env") or {})}


def differences(sides: dict) -> list[dict]:
    """The watched facts whose values differ over `sides` ({label: facts of one rank or run}).

    Returns [{"fact": name, "values": {label: value or None}}], versions first, then env vars by
    name; a fact missing on one side and set on another differs (None stands for missing)."""
    flat = {label: watched(f) for label, f in sides.items()}
    names = list(WATCHED_VERSIONS) + sorted({k for f in flat.values() for k in f} - set(WATCHED_VERSIONS))
    out = []
    for name in names:
        values = {label: f.get(name) for label, f in flat.items()}
        if len(set(values.values())) > 1:
            out.append({"fact": name, "values": values})
    return out


def common(sides: dict) -> dict[str, str]:
    """Versions (all recorded packages) and env vars equal on every side, flat: name -> value."""
    flat = [{**(f.get("versions") or {}), **(f.get("env") or {})} for f in sides.values()]
    if not flat:
        return {}
    return {k: v for k, v in flat[0].items() if all(f.get(k) == v for f in flat[1:])}


def run_facts(store) -> dict[str, dict[str, str]]:
    """One run's facts for a comparison with another run: each fact's value where all ranks agree,
    else the distinct values joined ("2.13.0 | 2.14.1"), so that a mixed run differs from any other."""
    per_rank = list(rank_facts(store).values())
    out: dict[str, dict[str, str]] = {"versions": {}, "env": {}}
    for part in ("versions", "env"):
        names = sorted({k for f in per_rank for k in f[part]})
        for name in names:
            values = sorted({str(f[part].get(name)) for f in per_rank if f[part].get(name) is not None})
            if values:
                out[part][name] = " | ".join(values)
    return out
