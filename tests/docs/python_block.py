"""Run one Python block of a doc, statement by statement, in the current folder:
`python python_block.py FILE`. A statement whose line ends with `# == VALUE` (continued on the
comment lines right after it that start `#   `; a long one may start on the line after the
statement) is an expression whose repr must match VALUE, floats
masked and `...` standing for any text (tests/docs/doc_blocks.py's rule for shown output). Prints
one line per check; exits 1 on a mismatch, with a traceback on an exception."""

from __future__ import annotations

import ast
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from doc_blocks import masked, shown_pattern  # noqa: E402

_SHOWN = re.compile(r"#\s*==\s*(.*)$")


def shown_value(lines: list[str], end: int) -> str | None:
    """The `# == VALUE` of the statement ending on line `end` (1-based), continuation lines joined."""
    m = _SHOWN.search(lines[end - 1])
    if not m and end < len(lines):  # a long value: on the comment line right after the statement
        m = re.match(r"^\s*#\s*==\s*(.*)$", lines[end])
        end += 1
    if not m:
        return None
    value = m.group(1)
    for line in lines[end:]:
        cont = re.match(r"^\s*#\s{2,}(.*)$", line)
        if not cont:
            break
        value += " " + cont.group(1)
    return value.strip()


def main(path: str) -> int:
    source = open(path).read()
    lines = source.splitlines()
    namespace: dict = {"__name__": "__main__"}
    failed = 0
    for stmt in ast.parse(source).body:
        want = shown_value(lines, stmt.end_lineno)
        code = ast.get_source_segment(source, stmt)
        if want is not None and isinstance(stmt, ast.Expr):
            got = repr(eval(compile(ast.Expression(stmt.value), path, "eval"), namespace))
            ok = bool(shown_pattern(want).fullmatch(masked(got)))
            failed += not ok
            print(f"{'ok' if ok else 'MISMATCH'}: {code}\n    shown: {want}\n    got:   {got}")
        elif want is not None:
            print(f"MISMATCH: {code}\n    shows a value, but is not an expression")
            failed += 1
        else:
            exec(compile(ast.Module([stmt], []), path, "exec"), namespace)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
