"""Typed run and rank metadata: what the root and each rank group say about the run, parsed once
by the store (RunStore.run_meta, RankView.meta) so that no reader outside tracekit/store reads an
attribute by its key. Fields match schemas/store-metadata.schema.json (`$defs` root, rank,
coords, mesh); a value of the wrong type is a ValueError/TypeError the reader turns into one
StoreError line. Absent optional facts are None (never a silent default).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Mapping


def _int(v, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f"{what} is {v!r}, not an integer")
    return v


def _opt_dict(attrs: Mapping, key: str) -> Mapping | None:
    value = attrs.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError(f"{key!r} is a {type(value).__name__}, not an object")
    return MappingProxyType(dict(value))


def _opt_str(attrs: Mapping, key: str) -> str | None:
    value = attrs.get(key)
    return value if isinstance(value, str) and value else None


@dataclass(frozen=True)
class Mesh:
    """One device mesh a rank lives in (`$defs/mesh`)."""

    dim_names: tuple
    shape: tuple
    coordinate: tuple

    @classmethod
    def from_attrs(cls, m) -> "Mesh":
        if not isinstance(m, dict):
            raise TypeError("a mesh is not an object")
        return cls(*(tuple(m.get(k) or ()) for k in ("dim_names", "shape", "coordinate")))


@dataclass(frozen=True)
class RankCoords:
    """A rank's place in the job (`$defs/coords`): its rank, the data/tensor-parallel degrees and
    positions, and its device meshes. `integers` holds every integer coordinate but `rank` (the
    named ones and any other a layout recorded), in recorded order; `attrs` the attribute as stored."""

    rank: int
    world_size: int | None
    dp_degree: int | None
    dp_rank: int | None
    tp_degree: int | None
    tp_rank: int | None
    local_rank: int | None
    meshes: tuple[Mesh, ...]
    integers: Mapping[str, int]
    attrs: Mapping

    @classmethod
    def from_attrs(cls, coords, rank: int) -> "RankCoords":
        if not isinstance(coords, dict):
            raise TypeError("coords is not an object")
        ints = {k: v for k, v in coords.items() if k != "rank" and isinstance(v, int) and not isinstance(v, bool)}
        meshes = coords.get("meshes") or []
        if not isinstance(meshes, list):
            raise TypeError("meshes is not a list")
        named = {k: ints.get(k) for k in ("world_size", "dp_degree", "dp_rank", "tp_degree", "tp_rank", "local_rank")}
        return cls(rank, **named, meshes=tuple(Mesh.from_attrs(m) for m in meshes),
                   integers=MappingProxyType(ints), attrs=MappingProxyType(dict(coords)))

    def to_attrs(self) -> dict:
        return dict(self.attrs)

    @property
    def data_parallel(self) -> tuple[int, int]:
        """(dp_degree, dp_rank); without recorded coordinates every rank is its own data shard."""
        world = self.attrs.get("world_size")
        degree = self.attrs.get("dp_degree", world if world is not None else -1)
        return int(degree), int(self.attrs.get("dp_rank", self.rank))

    def positions(self) -> dict[str, int]:
        """Its integer `*_rank` positions (dp_rank, tp_rank, ...), not `rank` or `local_rank`."""
        return {k: v for k, v in self.integers.items() if k.endswith("_rank") and k != "local_rank"}


@dataclass(frozen=True)
class RankMeta:
    """What a rank group says about the run and itself (`$defs/rank`)."""

    coords: RankCoords
    run: Mapping  # the run facts the rank reported (`$defs/run`: device, backend, mode, ...)
    versions: Mapping | None  # its own package versions (None: an older or imported store)
    env: Mapping | None  # its numeric environment variables
    fallback_ops: tuple | None  # ops it ran as CPU fallbacks (None: it reported none)
    replay_of: str | None  # the reference store it replayed from
    replayed_steps: tuple[int, ...] | None  # steps it ran from that reference's state
    is_replay: bool  # it recorded replay facts at all

    @classmethod
    def from_attrs(cls, attrs: Mapping, rank: int) -> "RankMeta":
        coords = attrs.get("coords", {"rank": rank})
        ops = attrs.get("fallback_ops")
        if ops is not None and not isinstance(ops, list):
            raise TypeError("fallback_ops is not a list")
        replay = attrs.get("replay")
        steps = replay.get("replayed_steps") if isinstance(replay, dict) else None
        return cls(
            coords=RankCoords.from_attrs(coords, rank),
            run=_opt_dict(attrs, "run") or MappingProxyType({}),
            versions=_opt_dict(attrs, "versions"), env=_opt_dict(attrs, "env"),
            fallback_ops=tuple(ops) if ops is not None else None,
            replay_of=_opt_str(attrs, "replay_of"),
            replayed_steps=tuple(s for s in steps if isinstance(s, int)) if isinstance(steps, list) else None,
            is_replay="replay" in attrs or "replay_of" in attrs,
        )


@dataclass(frozen=True)
class RunMeta:
    """What the root group says about the run (`$defs/root`)."""

    format_version: int
    command: tuple[str, ...] | None
    versions: Mapping  # the launcher's package versions
    env: Mapping  # the launcher's numeric environment variables
    run: Mapping  # run facts the launcher recorded (`$defs/run`)
    exit_status: object  # the launcher's exit status once it finalized the store, else None
    finished: bool  # a launcher finalized the store
    launcher: str | None
    launcherless: bool  # recorded through TRACEKIT_STORE: the launcher field is there, and null
    writers_outlived_launcher: bool
    replay_of: str | None

    @classmethod
    def from_attrs(cls, meta: Mapping) -> "RunMeta":
        command = meta.get("command")
        launcher = meta.get("launcher")
        return cls(
            format_version=_int(meta.get("format_version"), "format_version"),
            command=tuple(command) if isinstance(command, list) else None,
            versions=_opt_dict(meta, "versions") or MappingProxyType({}),
            env=_opt_dict(meta, "env") or MappingProxyType({}),
            run=_opt_dict(meta, "run") or MappingProxyType({}),
            exit_status=meta.get("exit_status"), finished="exit_status" in meta,
            launcher=launcher if isinstance(launcher, str) else None,
            launcherless="launcher" in meta and launcher is None,
            writers_outlived_launcher=bool(meta.get("writers_outlived_launcher")),
            replay_of=_opt_str(meta, "replay_of"),
        )


@dataclass(frozen=True)
class RunSetup:
    """What the run computed on, as a comparison names it (`$defs/run`): rank 0's run facts with
    the root metadata over them (RunStore.run). Values as recorded (a device may be a list: ranks
    on several); None where nothing says."""

    device: object
    backend: object
    mode: object  # the parallelism a script's run_info named (ddp, fsdp, ...)
    dtype: object  # the training dtype a script's run_info named

    @classmethod
    def from_attrs(cls, run: Mapping) -> "RunSetup":
        return cls(**{f.name: run.get(f.name) for f in fields(cls)})

    def known(self) -> dict:
        """The facts recorded, by field name, in field order."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
