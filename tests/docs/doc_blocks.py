"""The documents' fenced blocks, their markers, and how shown output is compared with real output.

Every fenced block of a tested document carries a marker on the line just before it:

    <!-- doc-test: run GROUP -->        bash commands, run in order in GROUP's folder
    <!-- doc-test: run GROUP installed -->   the same, the leading `python -m pip install ... && `
                                         dropped (the test environment is that install)
    <!-- doc-test: output GROUP [N] -->  what command N (1-based; default the last) of GROUP's latest
                                         run block prints: its lines appear in that order
    <!-- doc-test: python GROUP -->     Python run in GROUP's folder; `expr  # == VALUE` is checked
    <!-- doc-test: not-run REASON -->   commands not run here, and why (a GPU, a bucket, a placeholder)
    <!-- doc-test: text WHAT -->        not commands (a layout, a formula, a config file, a table)

A group is one folder that starts empty but for links to the checkout's files; its blocks run in
document order (README.md, docs/*.md sorted, samples/README.md), so a doc can read stores an earlier
doc's block made there. This module knows nothing of torch or pytest: the parsing and the
comparison are tested on their own (tests/docs/test_doc_markers.py).
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the documents whose commands run as tests, in the order their groups run them
DOCS = ["README.md", *sorted(f"docs/{f}" for f in os.listdir(os.path.join(REPO, "docs")) if f.endswith(".md")),
        "samples/README.md"]
KINDS = ("run", "output", "python", "not-run", "text")
_MARKER = re.compile(r"<!--\s*doc-test:\s*(.*?)\s*-->")
_FENCE = re.compile(r"^(```+|~~~+)(.*)$")
# the words a command line starts with: a block holding such a line is either run or says why not
COMMAND_WORDS = ("tracekit ", "torchrun ", "python ", "pip ", "chromium ")


@dataclass
class Block:
    doc: str
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    kind: str | None = None  # None: unmarked
    args: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def group(self) -> str | None:
        return self.args[0] if self.kind in ("run", "output", "python") and self.args else None


def blocks(doc: str, text: str | None = None) -> list[Block]:
    """Every fenced block of doc (a path relative to the repository), with its marker if any."""
    text = open(os.path.join(REPO, doc)).read() if text is None else text
    lines = text.splitlines()
    found, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith(m.group(1))), len(lines))
        b = Block(doc, i + 1, m.group(2).strip(), "\n".join(lines[i + 1:end]))
        marker = _MARKER.fullmatch(lines[i - 1].strip()) if i else None
        if marker:
            words = marker.group(1).split()
            b.kind, b.args = (words[0], words[1:]) if words else ("", [])
        found.append(b)
        i = end + 1
    return found


def marker_problems(b: Block) -> list[str]:
    """What is wrong with a block's marker: none, unknown, no group, no reason, commands in text."""
    if b.kind is None:
        return [f"{b.where}: fenced block without a <!-- doc-test: ... --> marker"]
    if b.kind not in KINDS:
        return [f"{b.where}: unknown marker {b.kind!r} (one of {', '.join(KINDS)})"]
    if b.kind in ("run", "output", "python") and not b.args:
        return [f"{b.where}: {b.kind} names no group"]
    if b.kind == "not-run" and len(b.args) < 2:
        return [f"{b.where}: not-run without a reason"]
    if b.kind == "text":
        if not b.args:
            return [f"{b.where}: text without saying what it is"]
        cmd = [line for line in b.text.splitlines() if line.lstrip().startswith(COMMAND_WORDS)]
        if cmd:
            return [f"{b.where}: a text block holds a command ({cmd[0].strip()!r}): run it or mark it not-run"]
    if b.kind == "run" and b.lang not in ("bash", "sh"):
        return [f"{b.where}: a run block is ```bash"]
    if b.kind == "python" and b.lang != "python":
        return [f"{b.where}: a python block is ```python"]
    return []


def indented_commands(doc: str, text: str | None = None) -> list[str]:
    """Commands shown as indented code (four spaces after a blank line) outside fences: they would
    escape the markers, so a doc shows commands only in fenced blocks."""
    text = open(os.path.join(REPO, doc)).read() if text is None else text
    out, fenced, prev = [], False, ""
    for n, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.startswith("    ") and not prev.strip() and line.strip().startswith(COMMAND_WORDS):
            out.append(f"{doc}:{n}: indented command {line.strip()!r}: put it in a fenced, marked block")
        prev = line
    return out


def commands(b: Block) -> list[str]:
    """A run block's commands: continuation lines joined, comments and blank lines dropped."""
    text = re.sub(r"\\\n\s*", "", b.text)
    out = []
    for line in text.splitlines():
        line = re.sub(r"(^|\s+)#\s.*$", "", line).strip()
        if line and not line.startswith("#"):
            if "installed" in b.args[1:]:
                line = re.sub(r"^python -m pip install [^&]*? && ", "", line, count=1)
            out.append(line)
    return out


_ASSIGN = re.compile(r'^(\w+)="([^"$`]*)"$')


def assignment(command: str) -> tuple[str, str] | None:
    """`T="..."` lines set a variable for the group's later commands."""
    m = _ASSIGN.match(command)
    return (m.group(1), m.group(2)) if m else None


def expand(command: str, variables: dict[str, str]) -> str:
    for name, value in variables.items():
        command = re.sub(rf"\${{?{name}\b}}?", lambda _: value, command)
    return command


def chain(command: str) -> list[str]:
    """`a && b && c` as its parts (run one after another, stopping at the first failure)."""
    return [p.strip() for p in command.split(" && ")]


_SAMPLE = re.compile(r"samples/(tutorial|plain)/train\.py")


def as_sample(command: str) -> dict | None:
    """A `tracekit record ... -- torchrun ... samples/X/train.py ...` command as the arguments of the
    tests' shared `recorded_sample` fixture (which records the same command once per test run), or
    None for anything else (replays: they read another store of the folder)."""
    words = shlex.split(command)
    if words[:2] != ["tracekit", "record"] or "--" not in words:
        return None
    cut = words.index("--")
    opts, job = words[2:cut], words[cut + 1:]
    if "--replay-from" in opts or "-o" not in opts:
        return None
    out = opts[opts.index("-o") + 1]
    record_args = [w for i, w in enumerate(opts) if w != "--force" and w != "-o" and (i == 0 or opts[i - 1] != "-o")]
    if len(job) < 4 or job[:2] != ["torchrun", "--standalone"] or not job[2].startswith("--nproc-per-node="):
        return None
    script = _SAMPLE.fullmatch(job[3])
    if not script:
        return None
    flags, extra, rest, i = {"--device": "cpu", "--backend": "gloo", "--steps": "10"}, [], job[4:], 0
    while i < len(rest):
        if (rest[i] in flags or rest[i] == "--parallelism") and i + 1 < len(rest):
            flags[rest[i]] = rest[i + 1]
            i += 2
        else:
            extra.append(rest[i])
            i += 1
    if "--parallelism" not in flags or (flags["--device"], flags["--backend"]) != ("cpu", "gloo"):
        return None
    return dict(out=out, mode=flags["--parallelism"], script=script.group(1), steps=int(flags["--steps"]),
                ranks=int(job[2].split("=", 1)[1]), extra=tuple(extra), record_args=tuple(record_args))


# --- comparing what a doc shows with what ran --------------------------------------------------------

# a float (a point or an exponent), or nan/inf: machine- and version-dependent digits. Integers (counts,
# steps, ranks, shapes, indices) are never masked, and neither is a verdict's word.
_FLOAT = re.compile(r"[-+]?(?:\d+\.\d*(?:e[-+]?\d+)?|\.\d+(?:e[-+]?\d+)?|\d+e[-+]?\d+)|\b(?:nan|inf)\b", re.I)


def masked(line: str) -> str:
    return " ".join(_FLOAT.sub("F", line).split())


def shown_pattern(want: str) -> re.Pattern:
    """A shown line as a pattern: floats masked, whitespace runs equal, `...` any text."""
    parts = masked(want).split("...")
    return re.compile(".*".join(re.escape(p) for p in parts))


def missing_lines(shown: list[str], actual: str) -> list[str]:
    """The shown lines not found in the actual output, in order (empty: it shows what runs)."""
    got = [masked(x) for x in actual.splitlines()]
    at, missing = 0, []
    for want in (w for w in shown if w.strip()):
        pattern = shown_pattern(want)
        hit = next((i for i in range(at, len(got)) if pattern.fullmatch(got[i])), None)
        if hit is None:
            missing.append(want)
        else:
            at = hit + 1
    return missing


# --- links --------------------------------------------------------------------------------------------

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# a project file named in prose: `docs/X.md`, samples/common/op_faults.py, ...
_PATH = re.compile(r"(?<![\w/.-])((?:docs|samples|bench|tests|schemas|tracekit|recorders|cli)/[\w./-]*\w\.(?:md|py|json|toml))")


def broken_links(doc: str, text: str | None = None) -> list[str]:
    """Relative links, and project paths named in the text, that point at no file."""
    text = open(os.path.join(REPO, doc)).read() if text is None else text
    here = os.path.dirname(os.path.join(REPO, doc))
    out = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if not os.path.exists(os.path.join(here, path)):
            out.append(f"{doc}: link to {target}, which is not a file of the project")
    for path in set(_PATH.findall(text)):
        if not os.path.exists(os.path.join(REPO, path)) and not os.path.exists(os.path.join(here, path)):
            out.append(f"{doc}: names {path}, which is not a file of the project")
    return sorted(out)
