"""Chapter 12's corpus: book/data/corpus.txt and the script that writes it
(tools/make_corpus.py)."""

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "book" / "data" / "corpus.txt"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("make_corpus", ROOT / "tools" / "make_corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def corpus():
    return CORPUS.read_text(encoding="utf-8")


# ----- the committed file ------------------------------------------------------------------------

def test_corpus_size_is_what_chapter_12_expects(corpus):
    # About 100-200 kB of prose from the intro and chapters 1-11 (158 kB on 2026-11-22); far
    # outside means the file was regenerated from a very different book, and every number
    # chapter 12 quotes must be re-checked.
    assert 100_000 <= len(corpus.encode("utf-8")) <= 200_000
    assert len(corpus.split()) > 15_000


@pytest.mark.parametrize("leftover", [
    r"`", r"\$", r"\\", r"[{}]", r"\|", r":::", r"\]\(", r"https?:", r"\*\*", r"(?m)^#",
    r"(?m)^\s*[-*+] ", r":(?:label|class|name):", r"\{(?:cite|doc|ref)\}",
    r"<(?!(?:eos|bos|pad)>)(?=\S)",  # HTML; the special tokens <eos> <bos> <pad> are words here
    r"<!--", r"&[a-z]+;",
], ids=lambda pattern: pattern)
def test_corpus_has_no_markup_left(corpus, leftover):
    found = re.search(leftover, corpus)
    assert found is None, corpus[max(found.start() - 60, 0):found.end() + 60]


def test_corpus_is_paragraphs_of_english(corpus):
    paragraphs = corpus.rstrip("\n").split("\n\n")
    assert corpus.endswith("\n") and not corpus.endswith("\n\n")
    assert all(p and "\n" not in p and p == p.strip() for p in paragraphs)
    words = corpus.split()
    assert sum(w.strip(".,;:!?()\"'") in {"the", "a", "of", "and", "is"} for w in words) \
        > 0.1 * len(words)
    assert "attention" in corpus and "dot product" in corpus


def test_corpus_leaves_out_chapter_12(corpus):
    # Chapter 12 tests how BPE splits this made-up word: it must not be in the training text.
    assert "ksowjmckder" not in corpus


# ----- the script --------------------------------------------------------------------------------

def test_script_reads_the_intro_and_chapters_1_to_11_of_this_book(script):
    names = [name for name, _ in script.sources()]
    chapters = sorted(p.name for p in (ROOT / "book").glob("[0-9][0-9]_*.ipynb"))
    assert "12_tokenization_bpe.ipynb" in chapters
    assert names == ["intro.md"] + [c for c in chapters if int(c[:2]) <= 11]
    assert names[-1].startswith("11_")
    assert "api.md" not in names and "notation.md" not in names


def test_script_leaves_out_chapter_12_and_later(script, tmp_path):
    for name, cell in (("01_a.ipynb", "Chapter one prose."),
                       ("12_tokenization_bpe.ipynb", "About ksowjmckder."),
                       ("13_later.ipynb", "A later chapter that trains on the corpus.")):
        notebook = {"cells": [{"cell_type": "markdown", "source": [cell]},
                              {"cell_type": "code", "source": ["print('code')"]}]}
        (tmp_path / name).write_text(json.dumps(notebook), encoding="utf-8")
    assert script.corpus(tmp_path) == "Chapter one prose.\n"


def test_script_keeps_prose_and_drops_markup(script):
    markdown = "\n".join([
        "(sec-label)=", "# Attention", "",
        "Each token $t_i$ asks a **query**, see {doc}`chapter 6 <06_x>` and {cite}`vaswani`,",
        "computed by `softmax` as $\\operatorname{softmax}(QK^\\top)$ [here](http://x.org).", "",
        "$$", "y = \\sum_j w_j v_j", "$$", "",
        "```python", "print('code')", "```", "",
        "```{exercise} Count pairs", ":label: ex-pairs", "", "Write *my_count*.", "```", "",
        "```{solution-start} ex-pairs", ":class: dropdown", "```", "",
        ":::{note}", "A note in prose.", ":::", "",
        "| a | b |", "|---|---|", "% a comment", "- first item", "- second item", "",
        "<div class='x'>A box.</div> <!-- hidden -->",
    ])
    assert script.prose(markdown) == [
        "Attention",
        ("Each token t_i asks a query, see chapter 6 and, computed by softmax as "
         "softmax(QK^ᵀ) here."),
        "Count pairs", "Write my_count.", "A note in prose.", "first item", "second item",
        "A box."]


@pytest.mark.parametrize("markdown, text", [
    # code that reads as words keeps them; other code goes, and so do the gaps it leaves
    ("Write `my_attend(masks, seen, recent)` that returns", "Write my_attend that returns"),
    ("call `.backward()` on it", "call backward on it"),
    ("of shape `(B, T, d_model)` or `(N,)`.", "of shape (B, T, d_model) or (N,)."),
    ("the token `<eos>` ends it", "the token <eos> ends it"),
    ("run `x = [t for t in y if t]` (`a @ b`).", "run."),
    # short maths keeps its text and its grouping; long maths goes
    ("a factor $e^{z_j - z_k}$ here", "a factor e^(z_j - z_k) here"),
    ("with $\\tau$ and $1/\\sqrt{d_k}$ and $d_{\\text{model}}$",
     "with τ and 1/√d_k and d_model"),
    ("positions $1, \\dots, t$ only", "positions 1, …, t only"),
    ("so $\\sum_i \\cos\\big((p - q)\\,\\omega_i\\big) = x$ holds", "so holds"),
])
def test_script_keeps_code_and_maths_that_read_as_text(script, markdown, text):
    assert script.prose(markdown) == [text]


CORPUS_SHA256 = "edfaa4a88b44bcddbb91d3acfc2d47c92df4abec2cc2411cf8c6a843c0606d7a"


def test_the_corpus_changes_only_deliberately():
    """Chapters 12-15 train on this file and quote numbers from it: a new corpus means
    re-executing them and re-checking their prose, then updating this hash."""
    import hashlib

    digest = hashlib.sha256((ROOT / "book" / "data" / "corpus.txt").read_bytes()).hexdigest()
    assert digest == CORPUS_SHA256
