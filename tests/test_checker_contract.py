"""Every exercise checker in the book keeps the same promises (minitransformer.exercises).

The chapter test files check each checker's own cases and hints; this file discovers every
checker of every chapter and checks what all of them must do: accept their reference solution,
report a stub as not implemented, and report a crash or a missing return without raising.
"""

import importlib
import pkgutil
from pathlib import Path

import pytest

import minitransformer.exercises as exercises
from minitransformer.exercises import Checker


def _all_checkers() -> dict[str, Checker]:
    found = {}
    for module_info in pkgutil.iter_modules(exercises.__path__):
        module = importlib.import_module(f"{exercises.__name__}.{module_info.name}")
        for name, value in vars(module).items():
            if isinstance(value, Checker):
                found[f"{module_info.name}.{name}"] = value
    return found


CHECKERS = _all_checkers()


def test_every_chapter_with_exercises_has_checkers():
    files = {path.stem for path in Path(exercises.__path__[0]).glob("chapter[0-9][0-9].py")}
    assert {f"chapter{n:02d}" for n in range(1, 8)} <= files       # chapters 1-7 have exercises
    chapters = {name.split(".")[0] for name in CHECKERS}
    missing = sorted(files - chapters)
    assert not missing, f"exercise modules without a Checker: {missing}"
    assert all(name.split(".")[1].startswith("check_") for name in CHECKERS)


def test_every_chapter_notebook_with_exercises_has_a_checker_module():
    book = Path(__file__).resolve().parent.parent / "book"
    files = {path.stem for path in Path(exercises.__path__[0]).glob("chapter[0-9][0-9].py")}
    for notebook in sorted(book.glob("[0-9][0-9]_*.ipynb")):
        if "{exercise}" in notebook.read_text(encoding="utf-8"):
            module = f"chapter{notebook.name[:2]}"
            assert module in files, f"{notebook.name} has exercises but no exercises/{module}.py"


@pytest.mark.parametrize("name", sorted(CHECKERS))
def test_accepts_its_reference(name, capsys):
    checker = CHECKERS[name]
    assert checker(checker.reference)
    assert capsys.readouterr().out == f"✓ all {len(checker.cases)} checks passed\n"


@pytest.mark.parametrize("name", sorted(CHECKERS))
def test_reports_a_stub_as_not_implemented(name, capsys):
    def stub(*args):
        raise NotImplementedError

    assert not CHECKERS[name](stub)
    assert capsys.readouterr().out == "✗ not implemented yet\n"


@pytest.mark.parametrize("name", sorted(CHECKERS))
def test_reports_a_crash_without_raising(name, capsys):
    assert not CHECKERS[name](lambda *args: 1 / 0)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1: for input ")
    assert out.endswith("your function raised ZeroDivisionError: division by zero\n")


@pytest.mark.parametrize("name", sorted(CHECKERS))
def test_messages_are_one_line(name):
    """Every message a checker gives for its listed mistakes is one line (no newline inside,
    as from a multi-line error such as load_state_dict's)."""
    checker = CHECKERS[name]
    if hasattr(checker, "run_many"):
        pytest.skip("the two-rank checker's messages are checked in its chapter's tests")
    for wrong in checker.mistakes.values():
        assert "\n" not in checker.run(wrong).message


@pytest.mark.parametrize("name", sorted(CHECKERS))
def test_reports_a_missing_return(name, capsys):
    assert not CHECKERS[name](lambda *args: None)
    assert capsys.readouterr().out.startswith("✗ case 1:")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # a listed mistake may divide 0 by 0
@pytest.mark.parametrize("name", sorted(CHECKERS))
def test_every_listed_mistake_is_caught_with_its_own_hint(name, capsys):
    checker = CHECKERS[name]
    if hasattr(checker, "run_many"):        # one launch of two processes for all of them
        verdicts = checker.run_many(list(checker.mistakes.values()))
        for hint, verdict in zip(checker.mistakes, verdicts):
            assert not verdict, f"{name} accepts the mistake it hints at: {hint}"
            assert verdict.message.endswith(f"Hint: {hint}"), (hint, verdict.message)
        return
    for hint, wrong in checker.mistakes.items():
        assert not checker(wrong), f"{name} accepts the mistake it hints at: {hint}"
        assert capsys.readouterr().out.rstrip("\n").endswith(f"Hint: {hint}"), hint


CHAPTER_MODULES = sorted(info.name for info in pkgutil.iter_modules(exercises.__path__)
                         if info.name.startswith("chapter"))


@pytest.mark.parametrize("name", CHAPTER_MODULES)
def test_importing_the_checkers_leaves_the_global_random_state_alone(name):
    import torch

    module = importlib.import_module(f"{exercises.__name__}.{name}")
    _ = torch.manual_seed(0)
    expected = torch.rand(3)
    _ = torch.manual_seed(0)
    importlib.reload(module)
    torch.testing.assert_close(torch.rand(3), expected)
