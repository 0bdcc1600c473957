"""Every ``*.md`` document the code and the READMEs cite is a file inside the repository.

The design documents live in ``docs/design/``. A citation resolves relative to the repository root
(``docs/design/method.md``) or to the citing file's folder (``README.md`` beside a module). Nothing cites
the design notes that used to live outside the repository.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The old design notes outside the repository (spelt in two parts so that this file does not cite them).
OUTSIDE_NOTES = re.compile(r"\b" + "ARCHITECTURE" + r"\.md\b|\b" + "ARCHITECTURE" + r"\s*(?:§|section\b)|\b"
                           + "RAY_" + r"NOTES\b")

#: A ``*.md`` path: letters, digits, ``_ . -`` and ``/``, not inside a longer path or a URL.
MD_PATH = re.compile(r"(?<![\w/.:<>-])((?:\.\.?/)*[\w.-]+(?:/[\w.-]+)*\.md)\b")

#: Files d3ray writes, named in its docs as outputs (``<out>/results.md``), not documents it cites.
OUTPUT_NAMES = frozenset({"results.md"})


def cited_md_paths(text: str) -> list[str]:
    """The ``*.md`` paths ``text`` names, in order, output file names left out."""
    return [m.group(1) for m in MD_PATH.finditer(text) if m.group(1) not in OUTPUT_NAMES]


def unresolved_citations(text: str, folder: Path, root: Path) -> list[str]:
    """The ``*.md`` paths cited in ``text`` (a file in ``folder``) that are no file inside ``root``.

    A path resolves when ``root / path`` or ``folder / path`` is a file whose resolved location lies
    inside ``root`` (``../outside/NOTES.md`` does not, even where that file exists).
    """
    root = root.resolve()
    missing = []
    for cited in cited_md_paths(text):
        places = ((base / cited).resolve() for base in (root, folder))
        if not any(p.is_file() and p.is_relative_to(root) for p in places):
            missing.append(cited)
    return missing


def outside_note_citations(text: str) -> list[str]:
    """The lines of ``text`` that cite the old design notes outside the repository."""
    return [line.strip() for line in text.splitlines() if OUTSIDE_NOTES.search(line)]


def citing_files(root: Path) -> list[Path]:
    """The files whose citations must resolve: d3ray's modules and READMEs, the job and sweep configs,
    the benchmarks, the top-level and design documents."""
    files = [*root.glob("d3ray/**/*.py"), *root.glob("d3ray/**/README.md"), *root.glob("jobs/**/*"),
             *root.glob("tune_configs/**/*"), *root.glob("bench/**/*"), *root.glob("*.md"),
             *root.glob("docs/design/**/*.md")]
    return sorted({f for f in files if f.is_file() and "__pycache__" not in f.parts})


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def test_unresolved_citations_synthetic_tree_flags_missing_and_outside(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "docs" / "design").mkdir(parents=True)
    (root / "docs" / "design" / "method.md").write_text("# method\n")
    (root / "pkg").mkdir()
    (root / "pkg" / "README.md").write_text("# pkg\n")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "NOTES.md").write_text("# outside\n")  # exists, but outside the repository
    text = ("see docs/design/method.md, section 2; README.md beside this file; docs/design/gone.md;\n"
            "../shared/NOTES.md; a run writes `results.md`; https://example.org/page.md\n")
    assert cited_md_paths(text) == ["docs/design/method.md", "README.md", "docs/design/gone.md",
                                    "../shared/NOTES.md"]
    assert unresolved_citations(text, root / "pkg", root) == ["docs/design/gone.md", "../shared/NOTES.md"]
    assert unresolved_citations("README.md", root, root) == ["README.md"]  # not beside it, not at the root


def test_outside_note_citations_synthetic_text_flags_both_notes() -> None:
    text = ("a = 1  # (" + "ARCHITECTURE" + ".md §1)\n"
            "b = 2  # (" + "RAY_" + "NOTES section 4)\n"
            "ARCHITECTURES = ('gpt2',)  # a Python name, not a citation\n"
            "c = 3  # docs/design/method.md\n")
    assert outside_note_citations(text) == [
        "a = 1  # (" + "ARCHITECTURE" + ".md §1)", "b = 2  # (" + "RAY_" + "NOTES section 4)"]


def test_repository_md_citations_resolve_inside_repository() -> None:
    files = citing_files(ROOT)
    assert any(f.name == "influence.py" for f in files)  # the walk found the package
    missing = {str(f.relative_to(ROOT)): bad for f in files
               if (bad := unresolved_citations(_text(f), f.parent, ROOT))}
    assert missing == {}


def test_repository_cites_no_outside_design_notes() -> None:
    found = {str(f.relative_to(ROOT)): lines for f in citing_files(ROOT) if (lines := outside_note_citations(_text(f)))}
    assert found == {}
