"""Train TorchTitan (0.3.0, unmodified) as `python -m torchtitan.train` does, on any host, CPU/gloo
included: `torchrun --standalone --nproc-per-node=2 samples/torchtitan/train.py --module llama3
--config llama3_debugmodel [TorchTitan flags ...]`.

Every flag goes to TorchTitan as given. Before it runs, the runner
- generates the tiny deterministic tokenizer and dataset (assets.py) into `--assets DIR`
  (default: ./torchtitan-assets) and points TorchTitan at them unless the command names its own
  (`--hf-assets-path`, `--dataloader.dataset-path`);
- on a CPU-only host passes `--parallelism.spmd-backend partial_dtensor` unless the command names
  a backend, and applies cpu_shim.py (what else CPU/gloo needs);
- with `--fault KIND:RANK:STEP` (the runner's own flag, repeatable, not passed on), plants a
  fault on rank RANK at step STEP (fault.py: a forward op, a backward-only op, an in-place write
  through a view, a collective's input, an optimizer op), for docs/LOCATE.md's root cause on
  TorchTitan; `ffn_bf16:RANK:STEP` rounds one op's result to bfloat16 and
  `grad_scale:RANK:STEP:FACTOR` scales one rank's gradients in one step
  (bench/bench_sensitivity.py --workload titan).
Once TorchTitan's main returns, the exit handlers run and the process ends without Python's
teardown of the modules TorchTitan imported (common/quick_exit.py: ~1.7 CPU-s per rank).
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))  # samples/, for common.quick_exit (the real torchtitan package still wins)

from common import quick_exit  # noqa: E402

if __name__ == "__main__":
    quick_exit.arm()  # before torch is imported: the first exit handler registered runs last

import assets  # noqa: E402
import cpu_shim  # noqa: E402
import fault  # noqa: E402


def has_flag(argv: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def take_flags(argv: list[str], flag: str) -> tuple[list[str], list[str]]:
    """(every value of the runner's own flag, in order; argv without them)."""
    rest, values, i = [], [], 0
    while i < len(argv):
        if argv[i] == flag and i + 1 < len(argv):
            values.append(argv[i + 1])
            i += 2
        elif argv[i].startswith(flag + "="):
            values.append(argv[i].split("=", 1)[1])
            i += 1
        else:
            rest.append(argv[i])
            i += 1
    return values, rest


def take_flag(argv: list[str], flag: str, default: str) -> tuple[str, list[str]]:
    """(value of the runner's own flag, the last one given; argv without it)."""
    values, rest = take_flags(argv, flag)
    return (values[-1] if values else default), rest


def torchtitan_args(argv: list[str], cpu: bool) -> list[str]:
    assets_root, argv = take_flag(argv, "--assets", "torchtitan-assets")
    tokenizer_dir, dataset_dir = assets.ensure_assets(os.path.abspath(assets_root))
    extra = []
    if not has_flag(argv, "--hf-assets-path"):
        extra += ["--hf-assets-path", tokenizer_dir]
    if not has_flag(argv, "--dataloader.dataset-path"):
        extra += ["--dataloader.dataset-path", dataset_dir]
    if cpu and not has_flag(argv, "--parallelism.spmd-backend"):
        extra += ["--parallelism.spmd-backend", "partial_dtensor"]
    return extra + argv


def main() -> None:
    # the assets are read locally; never ask the Hugging Face hub about them
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    cpu = cpu_shim.cpu_only()
    specs, argv = take_flags(sys.argv[1:], "--fault")
    try:
        planted = [fault.parse(spec) for spec in specs]
    except ValueError as e:
        print(f"Error: {e}", file=sys.stderr)
        sys.exit(2)
    sys.argv = [sys.argv[0], *torchtitan_args(argv, cpu)]
    cpu_shim.apply()
    if planted:
        fault.install(planted)
    from torchtitan.train import main as torchtitan_main

    torchtitan_main()
    quick_exit.ending(0)


if __name__ == "__main__":
    main()
