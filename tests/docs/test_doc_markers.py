"""The documents' blocks are all marked, their links lead somewhere, their stores do not collide;
and the marker rules themselves (tests/docs/doc_blocks.py). No process is launched here: running
the blocks is tests/e2e/docs/test_doc_commands.py."""

from __future__ import annotations

import os
import re

import pytest

from tests.docs.doc_blocks import (DOCS, REPO, as_sample, blocks, broken_links, chain, commands, indented_commands,
                        marker_problems, masked, missing_lines)
from tests.docs.doc_runs import all_groups

# every Markdown file of the project: links are checked in all of them, blocks in DOCS
ALL_MD = sorted(os.path.relpath(os.path.join(d, f), REPO) for d, dirs, files in os.walk(REPO)
                if not {".git", ".venv", "node_modules"} & set(os.path.relpath(d, REPO).split(os.sep))
                for f in files if f.endswith(".md"))


@pytest.mark.parametrize("doc", DOCS)
def test_every_block_is_marked(doc):
    problems = [p for b in blocks(doc) for p in marker_problems(b)] + indented_commands(doc)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", ALL_MD)
def test_links_lead_to_files_of_the_project(doc):
    assert not broken_links(doc), "\n".join(broken_links(doc))


def test_no_project_file_names_a_file_outside_it():
    """docs/workloads.md and docs/peers.md were never part of the project: nothing may send a reader there."""
    hits = []
    for folder in ("bench", "samples", "tracekit", "recorders", "cli", "docs", "tests"):
        for d, _, files in os.walk(os.path.join(REPO, folder)):
            for f in files:
                if f.endswith((".py", ".md")) and f != os.path.basename(__file__):
                    text = open(os.path.join(d, f), errors="replace").read()
                    hits += [f"{os.path.relpath(os.path.join(d, f), REPO)}: {m}"
                             for m in re.findall(r"docs/(?:peers|workloads)\.md", text)]
    assert not hits, hits


def test_no_two_docs_make_one_path_differently():
    """A path a doc's command writes (`-o PATH`, `--keep PATH`) is written by one command only, so a
    reader following two docs in one checkout never finds one doc's store where another expects its own."""
    makers: dict[str, set[str]] = {}
    for doc in DOCS:
        for b in blocks(doc):
            if b.kind not in ("run", "not-run"):  # the commands a reader may run, run here or not
                continue
            for command in commands(b):
                for part in chain(command):
                    m = re.search(r"(?:^| )(?:-o|--keep) (\S+)", part.split(" -- ")[0])
                    if m:
                        makers.setdefault(m.group(1).rstrip("/"), set()).add(part.replace("--force ", ""))
    clashes = {path: sorted(made) for path, made in makers.items() if len(made) > 1}
    assert not clashes, clashes


def test_groups_are_run():
    """Every group a python or output block names is made by a run block somewhere."""
    runs = set(all_groups())
    named = {b.group for doc in DOCS for b in blocks(doc) if b.group}
    assert named <= runs, named - runs


# --- the rules themselves ----------------------------------------------------------------------------

DOC = """Intro.

<!-- doc-test: run g -->
```bash
T="torchrun --standalone --nproc-per-node=2 samples/tutorial/train.py --parallelism ddp --steps 3"
# a comment
tracekit diff runs/a runs/b   # why
tracekit record -o runs/x -- \\
    $T --fault lr_scale=2
```

<!-- doc-test: text a layout -->
```
STORE/
```

```
unmarked
```

<!-- doc-test: text oops -->
```
tracekit show runs/a
```

<!-- doc-test: not-run -->
```
x
```
"""


def test_markers_are_read_and_checked():
    found = blocks("X.md", DOC)
    assert [(b.kind, b.args[:1]) for b in found] == [("run", ["g"]), ("text", ["a"]), (None, []), ("text", ["oops"]),
                                                     ("not-run", [])]
    problems = [p for b in found for p in marker_problems(b)]
    assert len(problems) == 3
    assert "without a <!-- doc-test" in problems[0] and "holds a command" in problems[1] and "reason" in problems[2]
    assert commands(found[0])[1:] == ["tracekit diff runs/a runs/b", "tracekit record -o runs/x -- $T --fault lr_scale=2"]


def test_indented_commands_are_found():
    assert indented_commands("X.md", "text\n\n    python x.py\n") and not indented_commands("X.md", "a\n    python x\n")


def test_the_install_is_dropped_only_from_installed_blocks():
    b = blocks("X.md", "<!-- doc-test: run g installed -->\n```bash\npython -m pip install -e . && tracekit diff a b && tracekit show a\n```\n")[0]
    assert commands(b) == ["tracekit diff a b && tracekit show a"]
    b.args = ["g"]
    assert commands(b) == ["python -m pip install -e . && tracekit diff a b && tracekit show a"]


def test_a_sample_recording_is_the_shared_fixture_call():
    s = as_sample("tracekit record --force -o runs/ref --kinds +local_loss -- torchrun --standalone --nproc-per-node=4 "
                  "samples/plain/train.py --parallelism fsdp --device cpu --backend gloo --fault op=x:1:2")
    assert s == dict(out="runs/ref", mode="fsdp", script="plain", steps=10, ranks=4, extra=("--fault", "op=x:1:2"),
                     record_args=("--kinds", "+local_loss"))
    assert as_sample("tracekit record -o runs/r --replay-from runs/ref -- torchrun --standalone --nproc-per-node=2 "
                     "samples/plain/train.py --parallelism ddp") is None
    assert as_sample("tracekit record -o r -- torchrun --standalone --nproc-per-node=2 samples/plain/train.py "
                     "--parallelism ddp --device cuda --backend nccl") is None


def test_masks_hide_digits_never_counts_or_verdicts():
    out = "loss 0.123456 took 1.5e-03 s\nFAIL comparison ranks=2 steps=3 violations=30 first_step=2\n"
    assert missing_lines(["loss 0.1 took 9e-9 s", "FAIL comparison ranks=2 steps=3 violations=30 first_step=2"], out) == []
    assert missing_lines(["FAIL comparison ranks=2 steps=3 violations=31 first_step=2"], out)
    assert missing_lines(["PASS comparison ranks=2 steps=3 violations=30 first_step=2"], out)
    assert missing_lines(["loss 0.1 took 9e-9 s", "13 events"], out + "5 events\n")
    assert missing_lines(["FAIL ... first_step=2"], out) == []
    # in order: a line shown before another must come before it
    assert missing_lines(["FAIL comparison ...", "loss ..."], out)
    assert masked("a   0.5  nan") == "a F F"


def test_each_doc_says_where_its_stores_come_from():
    """A doc whose blocks read a group's stores without making them names the doc that does (the
    README's main job, say), so a reader knows which command to run first."""
    maker: dict[str, str] = {}
    for doc in DOCS:
        for b in blocks(doc):
            if b.kind == "run":
                maker.setdefault(b.group, doc)
    silent = []
    for doc in DOCS:
        text = open(os.path.join(REPO, doc)).read()
        for group in sorted({b.group for b in blocks(doc) if b.group}):
            source = maker[group]
            if source != doc and os.path.splitext(os.path.basename(source))[0] not in text:
                silent.append(f"{doc} uses the stores of group {group!r} made in {source} without naming it")
    assert not silent, silent
