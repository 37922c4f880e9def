"""The checks a lent GPU is for, as one prepared command: CUDA candidates against CPU references
(docs/TORCHTITAN.md, "On a lent GPU").

Here, on a machine with the package index:

    python samples/device_check.py --prepare .whl

writes into .whl the wheels the GPU machine lacks, at the versions installed here: tracekit's
own, zarr's, and TorchTitan 0.3.0's with the packages it imports (that machine reaches no index; its image holds Python 3.12, torch,
numpy, click, xarray, xxhash, safetensors and tokenizers). There, with .whl carried:

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site python3 samples/device_check.py --out $OUT

Each check records a CPU reference and a candidate (one rank each: one GPU holds one NCCL rank)
with `tracekit record`, then runs `tracekit diff REF CAND`:

  plain-fp32      samples/plain (ddp), float32, CPU against CUDA
  plain-bf16      the same, the candidate's forward under autocast bf16
  titan-eager     TorchTitan's llama3 debug model, both from one seed checkpoint written on the CPU
                  (a seed alone need not draw the same weights on a CPU and a GPU), CPU against CUDA eager
  titan-compiled  the same, the candidate compiled (--compile.enable: inductor)

A check whose command fails (TorchTitan 0.3.0 needs torch >= 2.12, for one) is reported with
the error that command printed; the others still run. The verdicts are the findings: a FAIL of
a CUDA candidate is a result, not an error of this script. Without CUDA every candidate runs on
the CPU, as its reference did, and each diff must PASS, bit for bit (--exact) but for the compiled
one's (aot_eager there): that checks the script's plumbing (tests/e2e/samples/test_device_check.py).

Writes OUT/summary.json (per check: commands, exit codes, seconds, the verdict line; rewritten
after each check) and OUT/checks.log (every command's output). A command that runs past
--timeout (default 300 s) is ended with its ranks and reported as timed out (exit code 124). Exit 0 when every check ran and gave its verdict, 1 when
any command failed, 2 on a wrong flag.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What the GPU machine's image lacks: what a recorded TorchTitan rank imports
# (PYTHONPROFILEIMPORTTIME), less the packages that image holds. Each goes there at the version
# installed here, which the tests ran with (pins()).
WHEELS = ("zarr", "numcodecs", "donfig", "google-crc32c", "torchtitan", "spmd_types", "torchdata", "tyro",
          "docstring_parser", "typeguard", "datasets", "dill", "multiprocess")
# The GPU machine's Python (3.12) and platform: pip picks the wheels for it, not for this machine.
TARGET = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:",
          "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
          "--platform", "manylinux2014_x86_64"]

# Both sides of a TorchTitan check run the same configuration: the backend the CPU runner needs
# (samples/torchtitan/train.py) is named for the CUDA candidate too.
TITAN = ["--module", "llama3", "--config", "llama3_debugmodel", "--training.seq-len", "64",
         "--training.local-batch-size", "2", "--debug.seed", "0", "--parallelism.spmd-backend", "partial_dtensor"]


def pins() -> list[str]:
    """WHEELS at the versions installed here (KeyError naming one that is not installed)."""
    import importlib.metadata

    found = []
    for name in WHEELS:
        try:
            found.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            raise KeyError(name) from None
    return found


def prepare(folder: str) -> int:
    try:
        wanted = pins()
    except KeyError as e:
        print(f"Error: {e.args[0]} is not installed here, and the GPU machine gets the versions installed "
              f"here: pip install -e '.[dev]' first", file=sys.stderr)
        return 1
    os.makedirs(folder, exist_ok=True)
    pip = [sys.executable, "-m", "pip"]
    steps = [pip + ["download", "--no-deps", "-d", folder, *TARGET, *wanted],
             pip + ["wheel", "--no-deps", "--no-build-isolation", "-w", folder, ROOT]]
    for cmd in steps:
        if subprocess.run(cmd).returncode:
            print(f"Error: {' '.join(cmd[2:4])} failed (above)", file=sys.stderr)
            return 1
    print(f"wheels for the GPU machine in {folder}")
    return 0


def cuda_here() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


TIMED_OUT = 124  # a command's exit code in the summary when --timeout ended it (as timeout(1) gives it)


def _end_group(proc: subprocess.Popen) -> str:
    """End a command that ran out of time, and every process of its group (torchrun's ranks): SIGTERM,
    then SIGKILL 10 s on. What it printed, as far as it can be read (a process that left the group,
    such as a writer process, may hold the output open a while longer: then what came before)."""
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return proc.communicate(timeout=grace)[0] or ""
        except subprocess.TimeoutExpired:
            continue
    return ""


_EXCEPTION = re.compile(r"^(\[rank\d+\]: )?([A-Za-z_.]+(Error|Exception)|Exception):")


def _telling_line(output: str, rc: int) -> str:
    """The line that says how a command ended: its last one; for a failure, the last exception a
    traceback printed (a rank's, "[rank0]: RuntimeError: ..."), else the last "Error:" line of a
    tool. torchrun's ChildFailedError and banner, and `tracekit record`'s line that nothing was
    recorded, only say that a rank failed."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if rc != 0:
        for pattern in (_EXCEPTION, re.compile(r"^Error:")):
            found = [line for line in lines if pattern.match(line) and "ChildFailedError" not in line]
            if found:
                return found[-1]
    return lines[-1] if lines else ""


class Checks:
    """Runs the checks' commands in a scratch folder, each command once: a reference two checks
    share is recorded once, and a failure of it is every such check's result."""

    def __init__(self, work: str, log, timeout: float | None = None, on_result=None):
        self.work, self.log, self.timeout = work, log, timeout
        self.on_result = on_result  # called after each check: the summary is written as they come
        self.ran: dict[str, dict] = {}  # key -> its step (below)
        self.results: list[dict] = []

    def run(self, key: str, cmd: list[str], env: dict | None = None, verdict: bool = False) -> dict:
        """Run `cmd` (once per key); `verdict`: its last line says how it ended whatever its exit
        code (a diff's FAIL, exit 1, is a verdict, not an error to look for)."""
        if key in self.ran:
            return self.ran[key]
        self.log.write(f"$ {' '.join(cmd)}\n")
        self.log.flush()
        began = time.monotonic()
        # a process group of its own, so that a timeout ends the command's ranks with it
        proc = subprocess.Popen(cmd, cwd=self.work, env={**os.environ, **(env or {})}, start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            output, _ = proc.communicate(timeout=self.timeout)
            rc, last = proc.returncode, None
        except subprocess.TimeoutExpired:
            output, rc, last = _end_group(proc), TIMED_OUT, f"timed out after {self.timeout:g} s (--timeout)"
        seconds = round(time.monotonic() - began, 1)
        self.log.write(output + f"[exit {rc}, {seconds} s]\n\n")
        self.log.flush()
        if last is None:
            last = _telling_line(output, 0 if verdict else rc)
        step = self.ran[key] = {"key": key, "command": " ".join(cmd), "rc": rc, "seconds": seconds, "last": last}
        return step

    def check(self, name: str, commands: list[tuple], diff: list[str]) -> None:
        """Run `commands` ((key, argv, env or None) each) in order; once all have succeeded, the
        diff gives the verdict (its exit 0: PASS, 1: FAIL)."""
        entry: dict = {"check": name, "steps": []}
        for key, cmd, env in commands:
            step = self.run(key, cmd, env)
            entry["steps"].append(step)
            if step["rc"] != 0:
                entry["result"] = f"not run to the end: {step['key']} exited {step['rc']}: {step['last']}"
                break
        else:
            step = self.run(f"diff {name}", diff, verdict=True)
            entry["steps"].append(step)
            entry["verdict"] = step["last"]
            if step["rc"] not in (0, 1):
                entry["result"] = f"the diff gave no verdict (exit {step['rc']}): {step['last']}"
        self.results.append(entry)
        print(f"{name}: {entry.get('result') or entry['verdict']}", flush=True)
        if self.on_result is not None:
            self.on_result()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prepare", metavar="DIR", help="download the GPU machine's wheels into DIR, and stop")
    parser.add_argument("--out", metavar="DIR", help="where summary.json and checks.log go")
    parser.add_argument("--steps", type=int, default=5, help="training steps of each run (default 5)")
    parser.add_argument("--timeout", type=float, default=300, metavar="S",
                        help="seconds one command may take before it and its ranks are ended (default 300)")
    parser.add_argument("--only", action="append", choices=("plain-fp32", "plain-bf16", "titan-eager", "titan-compiled"),
                        help="run this check only (repeatable; default: all four)")
    args = parser.parse_args(argv)
    if args.prepare:
        return prepare(args.prepare)
    if not args.out:
        parser.error("--out DIR is required (or --prepare DIR)")
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.timeout <= 0:
        parser.error("--timeout must be more than 0 seconds")
    try:  # an --out that cannot be written: one line now, not a traceback after the first check
        os.makedirs(args.out, exist_ok=True)
        log = open(os.path.join(args.out, "checks.log"), "w")
    except OSError as e:
        parser.error(f"cannot write into --out {args.out}: {e.strerror or e}")
    wanted = set(args.only or ("plain-fp32", "plain-bf16", "titan-eager", "titan-compiled"))
    cuda = cuda_here()
    work = tempfile.mkdtemp(prefix="tracekit-device-check-")
    tk = [sys.executable, "-m", "tracekit.cli.main"]
    one = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"]
    plain = one + [os.path.join(ROOT, "samples", "plain", "train.py"), "--parallelism", "ddp", "--steps", str(args.steps)]
    gpu = ["--device", "cuda", "--backend", "nccl"] if cuda else []
    diff = tk + ["diff"]
    # without CUDA a candidate is its reference's twin: the diff must PASS bit for bit (but for the
    # compiled one, whose compiler may reorder float32 arithmetic: within the default tolerances)
    exact = [] if cuda else ["--exact"]
    hidden = {"CUDA_VISIBLE_DEVICES": ""}  # the runner trains on the CPU where it sees no GPU
    titan = one + [os.path.join(ROOT, "samples", "torchtitan", "train.py"), *TITAN,
                   "--training.steps", str(args.steps), "--assets", os.path.join(work, "assets")]
    seed = ["--checkpoint.enable", "--checkpoint.load-only", "--checkpoint.initial-load-path",
            os.path.join(work, "seed", "checkpoint", "step-0")]
    summary: dict = {"cuda": cuda, "steps": args.steps, "checks": []}
    try:
        import torch
        summary["torch"] = torch.__version__
        summary["device"] = torch.cuda.get_device_name(0) if cuda else "cpu"
    except ImportError:
        pass

    def write_summary() -> None:  # after each check: a run cut short still leaves the checks done
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump({**summary, "checks": checks.results}, f, indent=1)

    with log:
        checks = Checks(work, log, args.timeout, write_summary)
        try:
            def record(store: str, command: list[str], env: dict | None = None) -> tuple:
                return store, tk + ["record", "-o", store, "--"] + command, env

            cpu_ref = record("plain-cpu", plain)
            if "plain-fp32" in wanted:
                checks.check("plain-fp32", [cpu_ref, record("plain-fp32", plain + gpu)], diff + exact + ["plain-cpu", "plain-fp32"])
            if "plain-bf16" in wanted:
                bf16 = ["--autocast", "bf16"]
                # without CUDA the twin computes in bf16 too, or --exact could not pass
                ref = cpu_ref if cuda else record("plain-cpu-bf16", plain + bf16)
                checks.check("plain-bf16", [ref, record("plain-bf16", plain + gpu + bf16)], diff + exact + [ref[0], "plain-bf16"])
            seed_checkpoint = ("seed", titan + ["--checkpoint.enable", "--checkpoint.create-seed-checkpoint",
                                                "--dump-folder", os.path.join(work, "seed")], hidden)
            titan_ref = record("titan-cpu", titan + seed, hidden)
            for name, extra in (("titan-eager", []), ("titan-compiled", ["--compile.enable"])):
                if name in wanted:
                    # compiled on the CPU: aot_eager (inductor there needs a C++ compiler)
                    extra = extra + ([] if cuda or not extra else ["--compile.backend", "aot_eager"])
                    checks.check(name, [seed_checkpoint, titan_ref, record(name, titan + seed + extra, None if cuda else hidden)],
                                 diff + (exact if name == "titan-eager" else []) + ["titan-cpu", name])
        finally:
            write_summary()
            shutil.rmtree(work, ignore_errors=True)
    failed = [c["check"] for c in checks.results if c.get("result")]
    print(f"{'ERROR' if failed else 'DONE'} device check: {len(checks.results)} check(s), "
          f"{'CUDA ' + summary.get('device', '') if cuda else 'no CUDA: candidates on the CPU'}"
          + (f"; not run to the end: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
