"""Collect the book's own prose into book/data/corpus.txt (chapter 12 trains BPE on it).

Reads book/intro.md and the markdown cells of chapters 1-11, book/NN_*.ipynb with NN <= 11
(in file-name order; chapter 12 and the chapters after it train on the corpus and are left
out), and keeps the
English prose: code blocks, maths, MyST directives' markup, roles, labels, comments, tables,
HTML and images are removed; link texts, headings, list items and the text inside
admonitions and exercises stay. So that the
sentences still read, code in backticks keeps what reads as words: a name (`make book`), the
name of a call (`generate(model, idx)` becomes generate), a shape (`(B, T, d_model)`) and a
special token (`<eos>`); short maths keeps its text ($T$, $d_\text{model}$, $e^{z_j - z_k}$
becomes e^(z_j - z_k), $\tau$ becomes τ). Longer code and maths are dropped. Paragraphs become
single lines separated by a blank line. The output depends only on the input files.

    python tools/make_corpus.py            # writes book/data/corpus.txt
    python tools/make_corpus.py -o FILE    # writes FILE ("-" for standard output)

Standard library only, so it runs before the package is installed.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
OUTPUT = BOOK / "data" / "corpus.txt"

# Chapters 12-15 train on the corpus and measure it: no chapter may train on its own text (chapter
# 12's would put the random word it tests, ksowjmckder, into the training text). The corpus is
# the intro and the chapters before 12.
LAST_CHAPTER = 11

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
DISPLAY_MATH = re.compile(r"\$\$.*?\$\$", re.DOTALL)
INLINE_MATH = re.compile(r"(?<![\\$])\$(?!\s)(?P<tex>[^$\n]+?)(?<!\s)\$(?!\d)")
LATEX_ENV = re.compile(r"\\begin\{(?P<env>[\w*]+)\}.*?\\end\{(?P=env)\}", re.DOTALL)
IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
LINK = re.compile(r"\[(?P<text>[^\]]+)\]\((?P<url>[^)]*)\)")
FOOTNOTE = re.compile(r"\[\^[^\]]+\]")
HTML = re.compile(r"<!--.*?-->|</?[A-Za-z][^>\n]*>", re.DOTALL)
EMPHASIS = re.compile(r"(\*\*|__|\*|(?<!\w)_)(?=\S)(?P<text>.+?)(?<=\S)\1(?!\w)")
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
TEX_SYMBOLS = {"times": "×", "cdot": "·", "leq": "≤", "le": "≤", "geq": "≥", "ge": "≥",
               "infty": "∞", "pm": "±", "ldots": "…", "dots": "…", "approx": "≈",
               "to": "→", "top": "ᵀ", "odot": "⊙", "partial": "∂", "circ": "°",
               "lVert": "‖", "rVert": "‖", "alpha": "α", "beta": "β", "gamma": "γ",
               "delta": "δ", "Delta": "Δ", "epsilon": "ε", "varepsilon": "ε", "theta": "θ",
               "lambda": "λ", "mu": "μ", "sigma": "σ", "tau": "τ", "omega": "ω", "ell": "ℓ",
               "ln": "ln", "log": "log", "exp": "exp", "sin": "sin", "cos": "cos",
               "tanh": "tanh", "max": "max", "min": "min", "big": "", "Big": "",
               "left": "", "right": ""}
NAME = re.compile(r"[A-Za-z_][\w.\-]*(?: [\w.\-]+){0,2}")
CALL = re.compile(r"\.?(?P<name>[A-Za-z_][\w.]*)\(.*\)")
_ITEM = r"(?:\.\.\.|[\w.]+(?: [-+*] [\w.]+)*)"
SHAPE = re.compile(rf"\({_ITEM}(?:, {_ITEM})*,?\)")
SPECIAL_TOKEN = re.compile(r"<[a-z]+>")
# A special token such as <eos> is hidden from the HTML filter while a paragraph is cleaned.
ANGLES = str.maketrans("<>", "\ue000\ue001")
UNANGLES = str.maketrans("\ue000\ue001", "<>")
SKIP_LINE = re.compile(r"^\s*(?:\(.+\)=\s*$|%|:[\w-]+:|\||-{3,}\s*$|\*{3,}\s*$|={3,}\s*$)")


def sources(book: Path = BOOK) -> list[tuple[str, str]]:
    """(name, markdown) for the intro and every chapter's markdown cells, in reading order."""
    found = []
    intro = book / "intro.md"
    if intro.exists():
        found.append((intro.name, intro.read_text(encoding="utf-8")))
    for notebook in sorted(book.glob("[0-9][0-9]_*.ipynb")):
        if int(notebook.name[:2]) > LAST_CHAPTER:
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
    text = re.sub(r" ([,.;:!?)])", r"\1", text)  # again, where a removed ( ) stood
    return re.sub(r" {2,}", " ", text).strip().translate(UNANGLES)


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
        heading = re.search(r"^#\s+(.+)$", text, re.MULTILINE)
        if heading:
            found[path.stem] = heading[1].strip()
    return found


def _code_text(match: re.Match) -> str:
    """Code in backticks that reads as words stays: a name (`minitransformer`, `make book`),
    the name of a call (`generate(model, idx)`), a shape (`(B, T, d_model)`), a special token
    (`<eos>`). Other code goes."""
    code = match[2].strip()
    if NAME.fullmatch(code) and len(code) <= 40:
        return code
    call = CALL.fullmatch(code)
    if call:
        return call["name"]
    if SPECIAL_TOKEN.fullmatch(code):
        return code.translate(ANGLES)
    return code if SHAPE.fullmatch(code) and len(code) <= 40 else " "


def _math_text(match: re.Match) -> str:
    """Short maths that reads as text ($T$, $d_\\text{model}$, $n^2$, $T \\times d_k$, $\\tau$)
    stays, with the LaTeX taken out; anything else is dropped."""
    tex = re.sub(r"\\(?:text|mathrm|mathbf|mathit|operatorname)\{([^{}]*)\}", r"\1",
                 match["tex"])
    tex = re.sub(r"\\sqrt\s*\{(\w+)\}|\\sqrt\s*(\w+)", lambda m: "√" + (m[1] or m[2]), tex)
    tex = re.sub(r"\\([A-Za-z]+)", lambda m: TEX_SYMBOLS.get(m[1], m[0]), tex)
    tex = re.sub(r"\\[,;!: ]", " ", tex)
    while True:  # a sub- or superscript of more than one word keeps its grouping: e^(z_j - z_k)
        grouped = re.sub(r"([\^_])\{([^{}]*)\}",
                         lambda m: m[1] + (m[2] if re.fullmatch(r"[\w.]+|.", m[2])
                                           else f"({m[2]})"), tex)
        if grouped == tex:
            break
        tex = grouped
    tex = tex.replace("{", "").replace("}", "")
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
