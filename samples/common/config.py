"""The command line of both train.py scripts, parsed into one typed, validated TrainConfig."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from .faults import Faults, parse_faults

MODES = ("ddp", "fsdp", "tp", "simplefsdp_tp")
COMPILED_MODES = ("simplefsdp_tp",)
DEVICES = ("cpu", "cuda", "neuron")
BACKENDS = ("gloo", "nccl", "neuron")
# "none" runs the compiled mode eagerly (to tell compiler problems from model problems).
COMPILE_BACKENDS = ("aot_eager", "inductor", "neuron", "eager", "none")
DTYPES = ("float32", "float64")
# Low-precision compute over float32 weights: the forward under torch.autocast, or FSDP2's
# MixedPrecisionPolicy(param_dtype=..., reduce_dtype=float32). The names of the dtypes they compute in.
LOW_PRECISIONS = {"bf16": "bfloat16", "fp16": "float16"}
# The compiler each device uses when --compile-backend is not given (the doc's pairing).
DEFAULT_COMPILE_BACKEND = {"cpu": "aot_eager", "cuda": "inductor", "neuron": "neuron"}
DEFAULT_TP = 2


@dataclass(frozen=True)
class TrainConfig:
    parallelism: str
    device: str = "cpu"
    backend: str = "gloo"
    compile_backend: str | None = None  # set for compiled modes only (after resolve)
    seed: int = 0
    steps: int = 10
    expected_world_size: int | None = None
    tp: int | None = None  # simplefsdp_tp only: the tp degree (innermost mesh dim)
    dtype: str = "float32"
    lr: float = 0.01
    faults: Faults = field(default_factory=Faults)
    bias: bool = True  # False: the bias-free model (always so in simplefsdp_tp)
    autocast: str | None = None  # a LOW_PRECISIONS key: the forward runs under torch.autocast
    mixed_precision: str | None = None  # a LOW_PRECISIONS key: fsdp's MixedPrecisionPolicy param_dtype
    # each step, gather every parameter whole (DTensor.full_tensor()) and log its norm, as users'
    # loops do: async collectives inside the traced step, outside the model
    log_norms: bool = False

    @property
    def compiled(self) -> bool:
        return self.parallelism in COMPILED_MODES

    def run_info(self) -> dict:
        """What a recorder stores about the run (plain JSON values)."""
        return {
            "mode": self.parallelism,
            "device": self.device,
            "backend": self.backend,
            "seed": self.seed,
            "steps": self.steps,
            "dtype": self.dtype,
            "compile_backend": self.compile_backend,
            **({"autocast": self.autocast} if self.autocast else {}),
            **({"mixed_precision": self.mixed_precision} if self.mixed_precision else {}),
        }


def build_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--parallelism", required=True, choices=MODES)
    parser.add_argument("--device", default="cpu", choices=DEVICES)
    parser.add_argument("--backend", default="gloo", choices=BACKENDS)
    parser.add_argument(
        "--compile-backend",
        choices=COMPILE_BACKENDS,
        help="torch.compile backend of the compiled mode (simplefsdp_tp); "
        "default aot_eager on cpu, inductor on cuda, neuron on neuron",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--expected-world-size", type=int, help="fail unless torchrun started N ranks")
    parser.add_argument("--tp", type=int, help=f"simplefsdp_tp: tp degree (default {DEFAULT_TP})")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--autocast", choices=sorted(LOW_PRECISIONS),
                        help="run the forward and loss under torch.autocast in this dtype (outputs cast back to float32)")
    parser.add_argument("--mixed-precision", choices=sorted(LOW_PRECISIONS),
                        help="fsdp: FSDP2 MixedPrecisionPolicy(param_dtype=this, reduce_dtype=float32, float32 output)")
    parser.add_argument("--no-bias", action="store_true",
                        help="train the bias-free model (simplefsdp_tp's; compare other modes with it)")
    parser.add_argument("--log-norms", action="store_true",
                        help="each step, gather every parameter whole (full_tensor()) and print its norm")
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="plant a fault (repeatable): lr_scale=F, loss_scale=RANK:STEP:F, nan_grad=RANK:STEP, "
        "reported_loss_scale=STEP:F, grad_scale=RANK:STEP:F, opt_lr=RANK:STEP:F, crash=RANK:STEP:raise|exit|kill, "
        "stale_grad=STEP, swap_data=STEP, op=act|matmul_bf16|reduce_order|roll_rows|bwd_bf16:RANK:STEP",
    )
    return parser


def parse_config(argv: list[str] | None = None, description: str = "") -> TrainConfig:
    """Parse and validate; bad input ends in argparse's one-line usage error (exit 2)."""
    parser = build_parser(description)
    args = parser.parse_args(argv)
    try:
        return _to_config(args)
    except ValueError as error:
        parser.error(str(error))
        raise  # unreachable: parser.error exits


def _to_config(args: argparse.Namespace) -> TrainConfig:
    if args.steps < 1:
        raise ValueError(f"--steps must be at least 1, got {args.steps}")
    if args.expected_world_size is not None and args.expected_world_size < 1:
        raise ValueError(f"--expected-world-size must be at least 1, got {args.expected_world_size}")
    if not args.lr > 0:
        raise ValueError(f"--lr must be positive, got {args.lr}")
    if (args.backend, args.device) in (("nccl", "cpu"), ("nccl", "neuron"), ("neuron", "cpu"), ("neuron", "cuda")):
        raise ValueError(f"--backend {args.backend} cannot run --device {args.device}")
    compiled = args.parallelism in COMPILED_MODES
    if args.compile_backend is not None and not compiled:
        raise ValueError(f"--compile-backend applies to the compiled mode {COMPILED_MODES}, not {args.parallelism}")
    if args.tp is not None and args.parallelism != "simplefsdp_tp":
        raise ValueError("--tp applies to simplefsdp_tp only (tp mode shards over all ranks)")
    if args.mixed_precision is not None and args.parallelism != "fsdp":
        raise ValueError("--mixed-precision applies to fsdp only (FSDP2's MixedPrecisionPolicy)")
    if (args.autocast or args.mixed_precision) and args.dtype != "float32":
        raise ValueError("--autocast and --mixed-precision lower float32 math: use them with --dtype float32")
    tp = args.tp if args.tp is not None else DEFAULT_TP
    if compiled and tp < 1:
        raise ValueError(f"--tp must be at least 1, got {tp}")
    compile_backend = None
    if compiled:
        compile_backend = args.compile_backend or DEFAULT_COMPILE_BACKEND[args.device]
        if compile_backend == "none":
            compile_backend = None
    return TrainConfig(
        parallelism=args.parallelism,
        device=args.device,
        backend=args.backend,
        compile_backend=compile_backend,
        seed=args.seed,
        steps=args.steps,
        expected_world_size=args.expected_world_size,
        tp=tp if args.parallelism == "simplefsdp_tp" else None,
        dtype=args.dtype,
        lr=args.lr,
        faults=parse_faults(args.fault),
        bias=not args.no_bias and args.parallelism != "simplefsdp_tp",
        autocast=args.autocast,
        mixed_precision=args.mixed_precision,
        log_norms=args.log_norms,
    )
