"""Process-group and device setup for one torchrun worker, on cpu, cuda or neuron."""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .config import TrainConfig
from .errors import WorkloadError


@dataclass(frozen=True)
class Runtime:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        raise WorkloadError(
            f"{name} is not set: launch with torchrun, e.g. "
            "torchrun --standalone --nproc-per-node=2 samples/plain/train.py --parallelism ddp"
        )
    return int(value)


def world_size_from_env(config: TrainConfig) -> int:
    """WORLD_SIZE, checked against --expected-world-size before any collective can hang."""
    world_size = _env_int("WORLD_SIZE")
    if config.expected_world_size is not None and world_size != config.expected_world_size:
        raise WorkloadError(
            f"expected world size {config.expected_world_size} (--expected-world-size) "
            f"but torchrun started {world_size} ranks"
        )
    return world_size


def _select_device(config: TrainConfig, local_rank: int) -> torch.device:
    if config.device == "cpu":
        return torch.device("cpu")
    if config.device == "neuron":
        try:
            import torch_neuronx  # noqa: F401  registers the neuron device, backend and compiler
        except ImportError as error:
            raise WorkloadError(
                f"--device neuron needs the torch-neuronx package (TorchNeuron): {error}"
            ) from None
    elif not torch.cuda.is_available():
        raise WorkloadError("--device cuda but torch.cuda.is_available() is False")
    # One process per device core: each worker takes the device of its LOCAL_RANK.
    torch.accelerator.set_device_index(local_rank)
    return torch.device(config.device, local_rank)


def start(config: TrainConfig) -> Runtime:
    world_size = world_size_from_env(config)
    rank = _env_int("RANK")
    local_rank = _env_int("LOCAL_RANK")
    device = _select_device(config, local_rank)
    dist.init_process_group(backend=config.backend)
    return Runtime(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


def _release_process_group_holders() -> None:
    """Drop the caches that keep device meshes, and so their process groups, alive.

    DTensor's sharding-propagation and redistribution-plan caches (and compiled graphs) hold
    DTensorSpecs, which hold the DeviceMesh, which holds its process groups. A gloo group that
    outlives destroy_process_group keeps its worker threads until interpreter teardown, where the
    process can abort ("terminate called without an active exception") after a successful run.
    The caches are private, so each is cleared only where this torch has it.
    """
    torch._dynamo.reset()
    try:
        from torch.distributed.tensor import _collective_utils, _redistribute, debug
    except ImportError:
        return
    topology = getattr(_collective_utils, "MeshTopoInfo", None)
    clear_calls = (
        getattr(getattr(topology, "build_from_mesh", None), "cache_clear", None),
        getattr(debug, "_clear_sharding_prop_cache", None),
        getattr(_redistribute, "clear_redistribute_planner_cache", None),
        getattr(getattr(_redistribute, "_gen_transform_infos", None), "cache_clear", None),
    )
    for clear in clear_calls:
        if clear is not None:
            clear()


def stop() -> None:
    """Tear down this rank's distributed state; call after the model and optimizer are gone."""
    if dist.is_initialized():
        _release_process_group_holders()
        gc.collect()
        dist.destroy_process_group()
