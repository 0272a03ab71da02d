"""The offline corpus: docstring sentences, text files, a deterministic held-out split."""

from __future__ import annotations

import pytest

from trtqat.families.encoder.corpus import (
    CorpusError,
    builtin_sentences,
    load_corpus,
    sentences_from_docstring,
    split,
)

SMALL = ("json", "csv", "textwrap")


def test_docstring_prose_is_kept_and_code_dropped():
    doc = ("Return the :func:`len` of the given sequence of items.\n\n"
           "Example::\n\n    >>> f(1)\n    2\n\n"
           "Parameters\n----------\nx : int\n\n"
           "This sentence is long enough to be kept. Short.")
    assert sentences_from_docstring(doc) == [
        "Return the len of the given sequence of items.",
        "This sentence is long enough to be kept.",
    ]


def test_builtin_sentences_are_deterministic_and_unique():
    a, b = builtin_sentences(SMALL), builtin_sentences(tuple(reversed(SMALL)))
    assert a == b and len(a) > 50
    assert len({s.lower() for s in a}) == len(a)
    assert all(40 <= len(s) <= 240 and s[0].isupper() for s in a)


def test_split_is_fixed_and_disjoint():
    sents = tuple(f"Sentence number {i} of the list." for i in range(100))
    train, held = split(sents, heldout=0.1, seed=0)
    assert (train, held) == split(sents, heldout=0.1, seed=0)
    assert len(held) == 10 and len(train) == 90 and not set(train) & set(held)
    assert split(sents, heldout=0.1, seed=1)[1] != held
    assert len(split(sents, heldout=0.5, max_heldout=7)[1]) == 7
    assert len(split(sents, heldout=3)[1]) == 3


def test_text_file_corpus(tmp_path):
    f = tmp_path / "s.txt"
    f.write_text("first line\n\nsecond line\nfirst line\nthird line\n  fourth  \n")
    c = load_corpus(f, heldout=1)
    assert sorted(c.train + c.heldout) == ["first line", "fourth", "second line", "third line"]
    assert len(c.heldout) == 1 and c.source.startswith("file:")


def test_bad_corpora_are_refused(tmp_path):
    with pytest.raises(CorpusError, match="no such file"):
        load_corpus(tmp_path / "missing.txt")
    (tmp_path / "one.txt").write_text("only one\n")
    with pytest.raises(CorpusError, match="at least 2"):
        load_corpus(tmp_path / "one.txt")
