"""JSON Schemas of the store metadata and the diff report (shipped as tracekit.schemas)."""

import json
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def load(name: str) -> dict:
    """A schema by file stem, e.g. load('store-metadata') or load('diff-report')."""
    with open(os.path.join(_HERE, f"{name}.schema.json")) as f:
        return json.load(f)


def part(schema: dict, definition: str) -> dict:
    """A schema for one of `schema`'s $defs (e.g. 'rank'), keeping the $defs its $refs point to."""
    return {"$schema": schema["$schema"], "$defs": schema["$defs"], "$ref": f"#/$defs/{definition}"}
