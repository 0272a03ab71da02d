"""README.md as the tests read it: its sections, fenced code blocks and command lines."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
COMMANDS = ("trtqat", "trtqat-exec")


def section(title: str, text: str | None = None) -> str:
    """The text of the README's ``## title`` section (up to the next ``## ``)."""
    text = README.read_text() if text is None else text
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def code_blocks(text: str | None = None, lang: str | None = None) -> list[tuple[int, str]]:
    """``(line number, code)`` of every fenced block of ``text`` (the README by default),
    only those tagged ``lang`` when given (``""``: untagged)."""
    text = README.read_text() if text is None else text
    found = []
    for m in re.finditer(r"^```([a-z]*)\n(.*?)^```", text, re.DOTALL | re.MULTILINE):
        if lang is None or m[1] == lang:
            found.append((text.count("\n", 0, m.start()) + 2, m[2]))
    return found


def command_lines(text: str) -> list[str]:
    """The ``trtqat``/``trtqat-exec`` lines of ``text`` (continuations joined, comments and
    a leading ``$ `` removed)."""
    lines, current = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        line = (current + line).strip()
        current = ""
        line = re.sub(r"\s+#.*$", "", line).removeprefix("$ ").strip()
        if line.split(" ", 1)[0] in COMMANDS:
            lines.append(line)
    return lines


def file_name(code: str) -> str | None:
    """``NAME.py`` when a block's first line is ``# NAME.py`` (the README shows a file)."""
    match = re.match(r"# (\w+\.py)\n", code)
    return match[1] if match else None
