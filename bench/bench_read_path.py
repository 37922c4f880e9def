"""Benchmark of an old tree against the new one (not a test): is the read path no slower?

Issue 37's proof of no change, its speed half (the golden reports in tests/tracekit/compare/test_golden.py
are the other). Checks out --old REV (default: the merge-base of HEAD with main) with `git worktree
add` into a temporary folder and times, for both trees, on the same stores built once by this tree:
  diff pair        bench_diff's measurement: tracekit.diff of two stores of --size-mb that differ by
                   float32 noise everywhere (format: the older tree's current one);
  cli ...          bench_cli's commands, each a fresh process: diff --help, diff REF CAND (the
                   4-rank sample pair), show and show --json of a 16-rank store;
  open             tracekit.open of the 16-rank store and one kind's values loaded.
Each round runs every case on both trees back to back, their order swapped every round (so a
change of the machine's load falls on both), each tree through its own import root: a folder
laid out as the installed package (symlinks into that tree, by its pyproject's package-dir
mapping), on PYTHONPATH, run from a neutral folder, so the venv's editable install of this
checkout is never reached. Prints per case the medians and the ratios new/old, median and
[lowest - highest] over the rounds, in wall and CPU seconds (CPU: the number to read on a shared
machine), and says when the two trees' verdict lines or exit statuses differ.

    python bench/bench_read_path.py [--old REV] [--new REV] [--repeat 5] [--size-mb 64] [--dir DIR]
                                    [--diff-formats 1,4] [--diff-tensors 8]

--diff-formats builds a diff pair per format listed: format 1 times the packed-row reads
(store/segments.py's batches), formats 2-4 the saved pieces'; --diff-tensors sets the tensors per
kind (many small ones: the batching of back-to-back tensors).

--new REV checks out the new tree too (default: this working tree, uncommitted changes included);
`--old main --new main` times one tree against itself: the ratios' spread is the bench's noise.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
import tomllib

from bench_cli import MEASURE, build_small_pair, build_wide
from bench_diff import DIFF, build
from workdir import own_folder, remove_own

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# tracekit.open of a store, one kind's values read: wall and CPU seconds
OPEN = r"""
import sys, time
import tracekit
c = time.process_time(); t = time.perf_counter()
tree = tracekit.open(sys.argv[1])
for name in tree["gradients"].data_vars:
    tree["gradients"][name].values
print(time.perf_counter() - t, time.process_time() - c, "opened")
"""


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", ROOT, *args], check=True, capture_output=True, text=True).stdout.strip()


def format_version(tree: str) -> int:
    """The store format a tree writes by default (tracekit/store/format.py's FORMAT_VERSION)."""
    text = open(os.path.join(tree, "tracekit", "store", "format.py")).read()
    return int(re.search(r"^FORMAT_VERSION = (\d+)", text, re.M).group(1))


def import_root(tree: str, folder: str) -> str:
    """`folder` laid out as the installed package of `tree`: tracekit/ holds links to the tree's
    tracekit/ entries and, by its pyproject's package-dir mapping, its subpackages kept elsewhere
    (tracekit.cli from cli/, ...). On PYTHONPATH, it imports that tree's code and nothing else."""
    with open(os.path.join(tree, "pyproject.toml"), "rb") as f:
        mapping = tomllib.load(f).get("tool", {}).get("setuptools", {}).get("package-dir", {})
    pkg = os.path.join(folder, "tracekit")
    os.makedirs(pkg)
    src = os.path.join(tree, mapping.get("tracekit", "tracekit"))
    for entry in os.listdir(src):
        os.symlink(os.path.join(src, entry), os.path.join(pkg, entry))
    for name, sub in mapping.items():
        if name.startswith("tracekit.") and "." not in name[len("tracekit."):]:
            link = os.path.join(pkg, name[len("tracekit."):])
            if not os.path.lexists(link):
                os.symlink(os.path.join(tree, sub), link)
    return folder


def env_for(root: str) -> dict:
    return {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1"}


def check_imports(tree: str, root: str, cwd: str) -> None:
    """SystemExit unless the import root loads the tree's own tracekit, store, compare and cli."""
    code = ("import os, tracekit.store, tracekit.compare, tracekit.cli.main as m; "
            "print(*(os.path.realpath(x.__file__) for x in (tracekit.store, tracekit.compare, m)))")
    out = subprocess.run([sys.executable, "-c", code], env=env_for(root), cwd=cwd, capture_output=True, text=True)
    files = out.stdout.split()
    tree = os.path.realpath(tree)
    if out.returncode or len(files) != 3 or not all(f.startswith(tree + os.sep) for f in files):
        raise SystemExit(f"error: {root} does not import {tree} alone: {files or out.stderr.strip()[-300:]}")


def measure(case: tuple, root: str, cwd: str, jobs: int) -> tuple[float, float, str]:
    """One run of a case through one tree: (wall s, CPU s, what it answered: a verdict line or exit status)."""
    kind, args = case[1], case[2]
    if kind == "diff":
        code, argv = DIFF, [root, *args, str(jobs)]
    elif kind == "open":
        code, argv = OPEN, args
    else:  # a command line, in a fresh process
        code, argv = MEASURE, [sys.executable, "-m", "tracekit.cli.main", *args]
    out = subprocess.run([sys.executable, "-c", code, *argv], env=env_for(root), cwd=cwd, capture_output=True,
                         text=True)
    if out.returncode:
        raise SystemExit(f"error: {case[0]} failed in {root}: {out.stderr.strip()[-500:]}")
    f = out.stdout.split(maxsplit=4)
    if kind == "diff":  # bytes, wall, cpu, peak, verdict line
        return float(f[1]), float(f[2]), f"{f[4].strip()}, {int(f[0]) / 2**20:.0f} MiB compared"
    if kind == "open":
        return float(f[0]), float(f[1]), f[2]
    return float(f[0]), float(f[2]), f"exit {f[3]}"  # wall, peak KiB, cpu, exit status


def spread(ratios: list[float]) -> str:
    """A ratio's median and range over the rounds: 1.02x [0.97-1.08]."""
    return f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", default=None, help="the old tree's revision (default: git merge-base HEAD main)")
    ap.add_argument("--new", default=None, help="the new tree's revision (default: this working tree)")
    ap.add_argument("--repeat", type=int, default=5, help="rounds (each: every case on both trees)")
    ap.add_argument("--size-mb", type=float, default=64, help="size of each store of the diff pair")
    ap.add_argument("--jobs", type=int, default=2, help="the diff pair's --jobs")
    ap.add_argument("--diff-formats", default=None,
                    help="store formats of the diff pair, comma-separated, a pair each (default: the older tree's "
                         "current one); 1 times the packed-row reads (store/segments.py), 2-4 the pieces'")
    ap.add_argument("--diff-tensors", type=int, default=8, help="tensors per kind in the diff pair (default 8)")
    ap.add_argument("--dir", default=None, help="the folder to make the bench's own folder, tracekit-bench-read-path, "
                    "in (default: the temp folder); only that folder is removed at the end")
    a = ap.parse_args(argv)
    rev = a.old or git("merge-base", "HEAD", "main")
    remove_own(own_folder(a.dir, "tracekit-bench-read-path"))  # a fresh folder, whatever a killed run left
    work = own_folder(a.dir, "tracekit-bench-read-path")
    git("worktree", "prune")  # forgets a killed run's worktree, whose folder is gone
    trees = {"old": os.path.join(work, "old"), "new": os.path.join(work, "new") if a.new else ROOT}
    added = []
    try:
        for name, wanted in (("old", rev), ("new", a.new)):
            if wanted:
                git("worktree", "add", "--detach", trees[name], wanted)
                added.append(trees[name])
        return compare(a, rev, trees, work)
    finally:
        for tree in added:
            git("worktree", "remove", "--force", tree)
        remove_own(work)


def compare(a, rev: str, trees: dict, work: str) -> int:
    old_tree, new_tree = trees["old"], trees["new"]
    roots = {name: import_root(tree, os.path.join(work, f"import-{name}")) for name, tree in trees.items()}
    cwd = os.path.join(work, "cwd")  # not a checkout: nothing on sys.path[0] to shadow the import roots
    os.makedirs(cwd)
    for name in trees:
        check_imports(trees[name], roots[name], cwd)
    version = min(format_version(old_tree), format_version(new_tree))
    formats = [int(f) for f in a.diff_formats.split(",")] if a.diff_formats else [version]
    if any(not 1 <= f <= version for f in formats):
        raise SystemExit(f"error: --diff-formats: both trees write formats 1 to {version}")
    t = time.perf_counter()
    size = int(a.size_mb * 2**20)
    pairs = {}
    for f in formats:
        ref, cand = os.path.join(work, f"ref{f}"), os.path.join(work, f"cand{f}")
        build(ref, size, 2, 4, a.diff_tensors, 0.0, 0, f)
        build(cand, size, 2, 4, a.diff_tensors, 1e-7, 1, f)
        pairs[f] = [ref, cand]
    small_ref, small_cand = build_small_pair(os.path.join(work, "small"))
    wide = build_wide(os.path.join(work, "wide16"))
    new = f"{a.new} ({git('rev-parse', '--short', a.new)})" if a.new else f"{ROOT} (working tree)"
    print(f"old {rev} ({git('rev-parse', '--short', rev)}) vs new {new}; "
          f"stores built in {time.perf_counter() - t:.1f} s, diff pair format {','.join(map(str, formats))}, "
          f"{a.repeat} rounds", flush=True)
    cases = [
        *((f"diff pair v{f} ({a.size_mb:g} MB, {a.diff_tensors} t, -j{a.jobs})", "diff", pair) for f, pair in pairs.items()),
        ("cli: diff --help", "cli", ["diff", "--help"]),
        ("cli: diff REF CAND (4 ranks, 5 steps)", "cli", ["diff", small_ref, small_cand]),
        ("cli: show STORE (16 ranks)", "cli", ["show", wide]),
        ("cli: show --json STORE (16 ranks)", "cli", ["show", "--json", wide]),
        ("open STORE (16 ranks) + gradients", "open", [wide]),
    ]
    got = {(c[0], name): [] for c in cases for name in trees}
    for i in range(a.repeat):
        order = ("old", "new") if i % 2 == 0 else ("new", "old")
        for case in cases:
            for name in order:
                got[case[0], name].append(measure(case, roots[name], cwd, a.jobs))
    print(f"{'case':40} {'old wall':>9} {'new wall':>9} {'new/old wall':>22} {'old cpu':>8} {'new cpu':>8} "
          f"{'new/old cpu':>22}   answer (both trees)")
    differ = 0
    for label, _, _ in cases:
        old, new = got[label, "old"], got[label, "new"]
        walls = [n[0] / o[0] for o, n in zip(old, new)]
        cpus = [n[1] / o[1] for o, n in zip(old, new)]
        answers = {r[2] for r in old + new}
        note = f"   {old[0][2]}" if len(answers) == 1 else f"   ANSWERS DIFFER: {sorted(answers)}"
        differ += len(answers) > 1
        print(f"{label:40} {statistics.median(r[0] for r in old):9.3f} {statistics.median(r[0] for r in new):9.3f} "
              f"{spread(walls):>22} {statistics.median(r[1] for r in old):8.3f} "
              f"{statistics.median(r[1] for r in new):8.3f} {spread(cpus):>22}{note}")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
