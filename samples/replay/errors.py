"""Print, per step, the candidate's accumulated error and its replayed (one-step) error against REF.

    python samples/replay/errors.py runs/replay-ref runs/replay-cand runs/replay-cand-replay [--rank 0]

Error = the largest |parameter - reference parameter| over all parameters after the step, and its
size relative to the largest |reference parameter|. A small per-step error shows as an accumulated
column that grows with the steps while the replayed column stays flat.
"""

import argparse
import os
import sys

sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402

from tracekit import TracekitError, open_store  # noqa: E402


def max_param_error(ref, other, step: int) -> tuple[float, float]:
    worst, scale = 0.0, 0.0
    a, b = ref.read_kind("parameters", step), other.read_kind("parameters", step)
    for name, value in a.items():
        worst = max(worst, float(np.max(np.abs(b[name].astype(np.float64) - value))))
        scale = max(scale, float(np.max(np.abs(value))))
    return worst, worst / scale if scale else worst


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ref")
    parser.add_argument("candidate")
    parser.add_argument("replay")
    parser.add_argument("--rank", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        ref, cand, rep = (open_store(p).rank(args.rank) for p in (args.ref, args.candidate, args.replay))
        steps = [s for s in ref.steps("parameters") if s > 0 and s in cand.steps("parameters") and s in rep.steps("parameters")]
        print(f"{'step':>4}  {'accumulated':>12}  {'replayed':>12}  {'acc/replayed':>12}")
        for step in steps:
            acc, _ = max_param_error(ref, cand, step)
            loc, _ = max_param_error(ref, rep, step)
            ratio = f"{acc / loc:12.1f}" if loc else f"{'inf':>12}"
            print(f"{step:>4}  {acc:12.3e}  {loc:12.3e}  {ratio}")
    except TracekitError as error:
        print(f"Error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
