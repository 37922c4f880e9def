"""Text that reaches a terminal: names and paths from a store are data, never control sequences.

torch allows any string as a module name (newlines, ANSI escapes), so a tensor name printed raw
could forge a line such as `PASS comparison ...` in the middle of a FAIL report, or recolour it.
"""

from __future__ import annotations

import re

# C0 and C1 controls and DEL; newline is kept for the text's own lines, tab is harmless.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def shown(name: str) -> str:
    """A name as printed: itself when printable, else its repr (quotes, \\n, \\x1b, \\udcff escapes)."""
    name = str(name)
    return name if name.isprintable() else repr(name)


def terminal_safe(text: str) -> str:
    """Escape control characters (but newlines) and lone surrogates of a whole text, as a last line of defence."""
    text = _CONTROLS.sub(lambda m: repr(m.group())[1:-1], text)
    # a path with a non-UTF-8 byte decodes to a lone surrogate: no terminal can encode it
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def path_text(path) -> str:
    """A filesystem path as text that any UTF-8 output (a terminal, JSON, HTML, safetensors) accepts."""
    import os

    return os.fsdecode(path).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
