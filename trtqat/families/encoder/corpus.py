"""Unlabeled English sentences available offline, with a fixed held-out split.

``"builtin"``: sentences from the docstrings of a fixed list of Python standard-library
modules, read with ``ast`` from their source files (nothing is imported or executed).
Paragraphs that are code, doctests, tables or section headers are dropped, reST markup is
stripped, and the sentences are filtered by length and character mix, deduplicated
(case-insensitive), sorted, then shuffled with a fixed seed. The result depends only on the
Python version, which :attr:`Corpus.source` records.

A path: a UTF-8 text file with one sentence per line (blank lines and duplicates dropped),
shuffled and split the same way.
"""

from __future__ import annotations

import ast
import importlib.util
import random
import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from trtqat.errors import TrtqatError

BUILTIN = "builtin"
# Modules with prose docstrings; packages are read recursively. Order does not matter
# (sentences are sorted before the seeded shuffle), the set does.
DOC_MODULES = (
    "argparse", "ast", "asyncio", "base64", "bdb", "calendar", "cmd", "codecs", "collections",
    "concurrent", "configparser", "contextlib", "copy", "csv", "dataclasses", "datetime",
    "decimal", "difflib", "doctest", "email", "enum", "filecmp", "fractions", "ftplib",
    "functools", "getopt", "gettext", "glob", "gzip", "heapq", "hmac", "html", "http",
    "imaplib", "importlib", "inspect", "ipaddress", "json", "locale", "logging", "lzma",
    "mailbox", "mimetypes", "multiprocessing", "netrc", "numbers", "optparse", "os",
    "pathlib", "pdb", "pickle", "pickletools", "pkgutil", "platform", "plistlib", "poplib",
    "pprint", "pydoc", "queue", "random", "re", "sched", "secrets", "selectors", "shelve",
    "shlex", "shutil", "smtplib", "socket", "socketserver", "sqlite3", "ssl", "statistics",
    "string", "subprocess", "tarfile", "tempfile", "textwrap", "threading", "timeit",
    "tokenize", "trace", "traceback", "turtle", "typing", "unittest", "urllib", "uuid",
    "warnings", "wave", "weakref", "xml", "xmlrpc", "zipfile", "zipimport", "zoneinfo",
)
MIN_CHARS, MAX_CHARS = 40, 240
MIN_WORDS = 6

_ROLE = re.compile(r":[\w:.-]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`")
_TICKS = re.compile(r"`{1,2}([^`]*)`{1,2}")
_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_BAD = (">>>", "::", "{", "}", "==", "|", "\\", "http", "www.", "@", "#", "->", "[", "]",
        "e.g", "i.e", "etc.", "..", "*", "_", "=", "<", ">", "$", "%")
_ABBREV = re.compile(r"\b(?:[A-Z]|Mr|Dr|vs|No|Fig|St)\.$")


class CorpusError(TrtqatError, ValueError):
    """The text corpus is missing, empty or too small."""


@dataclass(frozen=True)
class Corpus:
    """Sentences split once, deterministically, into ``train`` and ``heldout``."""

    train: tuple[str, ...]
    heldout: tuple[str, ...]
    source: str
    seed: int = 0
    info: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.train) + len(self.heldout)


def _clean(text: str) -> str:
    text = _ROLE.sub(r"\1", text)
    text = _TICKS.sub(r"\1", text)
    return " ".join(text.split())


def _is_prose(paragraph: str) -> bool:
    lines = paragraph.splitlines()
    if any(line.startswith((" ", "\t", ">>>", "..", "-", "*", "+", "=", ":")) for line in lines):
        return False  # indented code, doctest, directive, list, table or underline
    if len(lines) > 1 and set(lines[1].strip()) <= set("-=~^"):
        return False  # a section header such as "Parameters\n----------"
    return True


def _good(sentence: str) -> bool:
    if not MIN_CHARS <= len(sentence) <= MAX_CHARS or len(sentence.split()) < MIN_WORDS:
        return False
    if not (sentence[0].isupper() and sentence[-1] in ".!?") or _ABBREV.search(sentence):
        return False
    if any(b in sentence for b in _BAD):
        return False
    letters = sum(c.isalpha() or c == " " for c in sentence)
    return letters >= 0.9 * len(sentence) and any(c.islower() for c in sentence[1:])


def sentences_from_docstring(doc: str) -> list[str]:
    """The prose sentences of one (cleaned) docstring."""
    out = []
    for paragraph in re.split(r"\n\s*\n", doc):
        if not _is_prose(paragraph):
            continue
        for sentence in _SPLIT.split(_clean(paragraph)):
            sentence = sentence.strip()
            if _good(sentence):
                out.append(sentence)
    return out


def _source_files(module: str) -> list[Path]:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return []
    if spec.submodule_search_locations:
        files = []
        for root in spec.submodule_search_locations:
            files += [p for p in sorted(Path(root).rglob("*.py"))
                      if "test" not in p.relative_to(root).parts[0].lower()]
        return files
    return [Path(spec.origin)] if spec.origin.endswith(".py") else []


def _docstrings(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return []
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(
        n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    return [d for d in (ast.get_docstring(n) for n in nodes) if d]


@lru_cache(maxsize=2)
def builtin_sentences(modules: tuple[str, ...] = DOC_MODULES) -> tuple[str, ...]:
    """Deduplicated docstring sentences of ``modules``, sorted (before any shuffle)."""
    seen: dict[str, str] = {}
    for module in modules:
        for path in _source_files(module):
            for doc in _docstrings(path):
                for s in sentences_from_docstring(doc):
                    seen.setdefault(s.lower(), s)
    return tuple(sorted(seen.values()))


def text_file_sentences(path: str | Path) -> tuple[str, ...]:
    """The non-blank lines of a UTF-8 text file, stripped, first occurrence of each kept."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"--data {path}: no such file; pass a text file with one sentence "
                          f"per line, or '{BUILTIN}' for the built-in corpus")
    lines = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
    return tuple(dict.fromkeys(line for line in lines if line))


def split(sentences: tuple[str, ...], heldout: float | int = 0.1, max_heldout: int = 500,
          seed: int = 0) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Shuffle with ``seed`` and cut off the held-out part (a fraction, or a count).

    A fraction is capped at ``max_heldout`` sentences; both parts keep at least one.
    """
    n = len(sentences)
    if n < 2:
        raise CorpusError(f"the corpus has {n} sentence(s): it needs at least 2 (train + held-out)")
    if isinstance(heldout, float):
        if not 0.0 < heldout < 1.0:
            raise CorpusError(f"heldout fraction must be in (0, 1), got {heldout}")
        k = min(max_heldout, round(n * heldout))
    else:
        k = heldout
    k = min(max(1, k), n - 1)
    order = list(sentences)
    random.Random(seed).shuffle(order)
    return tuple(order[k:]), tuple(order[:k])


def load_corpus(data: str | Path | None = BUILTIN, heldout: float | int = 0.1,
                max_heldout: int = 500, seed: int = 0) -> Corpus:
    """The corpus named by ``data`` (``"builtin"``/None, or a text file), split once."""
    if data is None or str(data) == BUILTIN:
        sentences = builtin_sentences()
        source = (f"builtin: docstrings of {len(DOC_MODULES)} standard-library modules, "
                  f"Python {sys.version_info.major}.{sys.version_info.minor}."
                  f"{sys.version_info.micro}")
    else:
        sentences = text_file_sentences(data)
        source = f"file: {Path(data)}"
    train, held = split(sentences, heldout, max_heldout, seed)
    return Corpus(train=train, heldout=held, source=source, seed=seed,
                  info={"sentences": len(sentences), "train": len(train), "heldout": len(held)})
