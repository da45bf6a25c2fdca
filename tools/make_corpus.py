"""Collect the book's own prose into book/data/corpus.txt (chapter 12 trains BPE on it).

Reads book/intro.md and the markdown cells of the chapters book/NN_*.ipynb (in file-name
order, so a new chapter simply joins in; chapter 12 itself is left out), and keeps the
English prose: code blocks, maths, MyST directives' markup, roles, labels, comments, tables,
HTML and images are removed; link texts, headings, list items and the text inside
admonitions and exercises stay. So that the
sentences still read, a name in backticks (`make book`) and short maths that reads as text
($T$, $d_\text{model}$, $n^2$) keep their words; longer code and maths are dropped. Paragraphs
become single lines separated by a blank line. The output depends only on the input files.

    python tools/make_corpus.py            # writes book/data/corpus.txt
    python tools/make_corpus.py -o FILE    # writes FILE ("-" for standard output)

Standard library only, so it runs before the package is installed.
"""

from __future__ import annotations

import argparse
import json
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
OUTPUT = BOOK / "data" / "corpus.txt"

# Chapter 12 trains on the corpus and measures it: its own prose would make the book read about
# its tokenizer, and put the made-up word it tests (ksowjmckder) into the training text.
EXCLUDED = {"12_tokenization_bpe.ipynb"}

# Directives whose body is prose (kept) rather than code, maths or a picture (dropped).
PROSE_DIRECTIVES = {"note", "tip", "hint", "important", "warning", "caution", "attention",
                    "danger", "error", "seealso", "admonition", "exercise", "solution",
                    "margin", "sidebar", "epigraph", "topic", "div", "dropdown", "card",
                    "solution-start", "solution-end"}
# Roles whose text is prose: {doc}`chapter 6 <06_x>` keeps "chapter 6"; {cite}`key` goes.
PROSE_ROLES = {"doc", "ref", "term", "abbr", "sub", "sup", "strong", "emphasis", "download"}

FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,}|:{3,})\s*(?P<info>.*)$")
DIRECTIVE = re.compile(r"^\{(?P<name>[\w-]+)\}")
ROLE = re.compile(r"\{(?P<name>[\w:-]+)\}`(?P<text>[^`]*)`")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
DISPLAY_MATH = re.compile(r"\$\$.*?\$\$", re.S)
INLINE_MATH = re.compile(r"(?<![\\$])\$(?!\s)(?P<tex>[^$\n]+?)(?<!\s)\$(?!\d)")
LATEX_ENV = re.compile(r"\\begin\{(?P<env>[\w*]+)\}.*?\\end\{(?P=env)\}", re.S)
IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
LINK = re.compile(r"\[(?P<text>[^\]]+)\]\((?P<url>[^)]*)\)")
FOOTNOTE = re.compile(r"\[\^[^\]]+\]")
HTML = re.compile(r"<!--.*?-->|</?[A-Za-z][^>\n]*>", re.S)
EMPHASIS = re.compile(r"(\*\*|__|\*|(?<!\w)_)(?=\S)(?P<text>.+?)(?<=\S)\1(?!\w)")
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
TEX_SYMBOLS = {"times": "×", "cdot": "·", "leq": "≤", "le": "≤", "geq": "≥", "ge": "≥",
               "infty": "∞", "pm": "±", "ldots": "...", "dots": "...", "approx": "≈",
               "to": "→", "top": "ᵀ"}
SKIP_LINE = re.compile(r"^\s*(?:\(.+\)=\s*$|%|:[\w-]+:|\||-{3,}\s*$|\*{3,}\s*$|={3,}\s*$)")


def sources(book: Path = BOOK) -> list[tuple[str, str]]:
    """(name, markdown) for the intro and every chapter's markdown cells, in reading order."""
    found = []
    intro = book / "intro.md"
    if intro.exists():
        found.append((intro.name, intro.read_text(encoding="utf-8")))
    for notebook in sorted(book.glob("[0-9][0-9]_*.ipynb")):
        if notebook.name in EXCLUDED:
            continue
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
        markdown = ["".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown"]
        found.append((notebook.name, "\n\n".join(markdown)))
    return found


def strip_blocks(markdown: str) -> list[str]:
    """The lines outside code, maths and non-prose directives; fence lines themselves go."""
    kept, stack = [], []  # stack of (fence, keep body?) for the fences we are inside
    for line in markdown.splitlines():
        match = FENCE.match(line)
        if match:
            fence, info = match["fence"], match["info"].strip()
            if stack and fence[0] == stack[-1][0][0] and len(fence) >= len(stack[-1][0]) \
                    and not info:
                stack.pop()
                continue
            if not info and fence[0] != ":" and stack and not stack[-1][1]:
                continue
            directive = DIRECTIVE.match(info)
            name = directive["name"] if directive else ""
            keep = (not stack or stack[-1][1]) and (
                name in PROSE_DIRECTIVES or (fence[0] == ":" and not directive))
            stack.append((fence, keep))
            if keep and directive and not name.startswith("solution"):  # titled by a label
                title = info[directive.end():].strip()
                if title:
                    kept.append(title)
            continue
        if stack and not stack[-1][1]:
            continue
        kept.append(line)
    return kept


def strip_inline(text: str) -> str:
    """Prose from one paragraph: roles, code, maths and markup removed."""
    text = LATEX_ENV.sub(" ", text)
    text = DISPLAY_MATH.sub(" ", text)
    text = ROLE.sub(_role_text, text)
    text = INLINE_CODE.sub(_code_text, text)
    text = INLINE_MATH.sub(_math_text, text)
    text = IMAGE.sub(" ", text)
    text = LINK.sub(lambda m: m["text"], text)
    text = FOOTNOTE.sub("", text)
    text = HTML.sub(" ", text)
    for _ in range(2):  # nested emphasis, e.g. ***both***
        text = EMPHASIS.sub(lambda m: m["text"], text)
    text = re.sub(r"\\([\\`*_{}\[\]()#+\-.!$])", r"\1", text)  # markdown escapes
    text = re.sub(r"[ \t]+", " ", text)
    text = re.sub(r" ([,.;:!?)])", r"\1", text)
    text = re.sub(r"\( ", "(", text)
    text = re.sub(r"([,;:])(?:\s*[,;:])+", r"\1", text)  # what was left around removed code
    text = re.sub(r"\(\s*[,;:]?\s*\)", "", text)
    text = re.sub(r"[,;:]([.!?])", r"\1", text)
    return re.sub(r" {2,}", " ", text).strip()


def _role_text(match: re.Match) -> str:
    name, text = match["name"].split(":")[-1], match["text"]
    if name not in PROSE_ROLES:
        return " "
    if "<" in text:
        return re.sub(r"\s*<[^>]*>$", "", text)
    if name == "doc":  # a bare {doc}`02_markov_models` shows the page's title
        return titles().get(Path(text).stem, " ")
    return text


@functools.cache
def titles(book: Path = BOOK) -> dict[str, str]:
    """Each page's title (its first heading), by file stem, for bare {doc} links."""
    found = {}
    for path in sorted(book.glob("*.md")) + sorted(book.glob("*.ipynb")):
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".ipynb":
            text = "\n".join("".join(cell["source"]) for cell in json.loads(text)["cells"]
                             if cell["cell_type"] == "markdown")
        heading = re.search(r"^#\s+(.+)$", text, re.M)
        if heading:
            found[path.stem] = heading[1].strip()
    return found


def _code_text(match: re.Match) -> str:
    """A name in backticks (`minitransformer`, `make book`) reads as a word; other code goes."""
    code = match[2].strip()
    return code if re.fullmatch(r"[A-Za-z_][\w.\-]*(?: [\w.\-]+){0,2}", code) \
        and len(code) <= 40 else " "


def _math_text(match: re.Match) -> str:
    """Short maths that reads as text ($T$, $d_\\text{model}$, $n^2$, $T \\times d_k$) stays,
    with the LaTeX taken out; anything else is dropped."""
    tex = re.sub(r"\\(?:text|mathrm|mathbf|mathit|operatorname)\{([^{}]*)\}", r"\1",
                 match["tex"])
    tex = re.sub(r"\\([A-Za-z]+)", lambda m: TEX_SYMBOLS.get(m[1], m[0]), tex)
    tex = re.sub(r"\\[,;!: ]", " ", tex).replace("{", "").replace("}", "")
    tex = re.sub(r"\s+", " ", tex).strip()
    return tex if "\\" not in tex and len(tex) <= 24 else " "


def prose(markdown: str) -> list[str]:
    """The paragraphs of one document, each on one line."""
    paragraphs, current = [], []

    def flush() -> None:
        text = strip_inline(" ".join(current))
        if re.search(r"[A-Za-z]{2}", text):
            paragraphs.append(text)
        current.clear()

    lines = strip_blocks(DISPLAY_MATH.sub("\n", markdown))
    for line in lines:
        if not line.strip() or SKIP_LINE.match(line):
            flush()
            continue
        line = re.sub(r"^\s*>\s?", "", line)  # block quote
        heading = re.match(r"^\s*#{1,6}\s+", line)
        if heading or LIST_ITEM.match(line):
            flush()  # a heading or a list item starts a paragraph of its own
        line = LIST_ITEM.sub("", re.sub(r"^\s*#{1,6}\s+", "", line))
        line = re.sub(r"^\s*:\s+", "", line)  # definition list
        current.append(line.strip())
        if heading:
            flush()
    flush()
    return paragraphs


def corpus(book: Path = BOOK) -> str:
    """The whole corpus: every document's paragraphs, separated by blank lines."""
    paragraphs = [p for _, markdown in sources(book) for p in prose(markdown)]
    return "\n\n".join(paragraphs) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default=str(OUTPUT), help="file to write, - for stdout")
    args = parser.parse_args()
    text = corpus()
    if args.output == "-":
        print(text, end="")
        return
    path = Path(args.output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", newline="\n")
    print(f"wrote {path} ({len(text.encode('utf-8')):,} bytes, "
          f"{len(text.split()):,} words, {len(sources())} documents)")


if __name__ == "__main__":
    main()
