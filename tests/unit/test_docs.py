"""The docs cannot drift: the command-line reference is the parsers' own help, every long
flag is documented, every relative link resolves, and the README stays a front page."""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _reference():
    return _script("cli_reference")


def test_the_cli_reference_is_generated_from_the_parsers_and_current():
    reference = _reference()
    assert (DOCS / "cli-reference.md").read_text() == reference.render(), (
        "docs/cli-reference.md is out of date: python scripts/cli_reference.py > "
        "docs/cli-reference.md")


def test_the_cli_reference_does_not_depend_on_the_interpreter_s_path(monkeypatch):
    """Issue 45.7: the path was replaced after argparse had wrapped the text around it, so
    a virtualenv with a longer path wrapped --python's help differently."""
    monkeypatch.setattr(sys, "executable", "/opt/a/very/long/path/to/a/virtual/environment/"
                                           "made/for/this/project/bin/python3.11")
    assert (DOCS / "cli-reference.md").read_text() == _reference().render()


def test_every_long_flag_of_every_command_is_in_the_docs():
    text = "\n".join(p.read_text() for p in DOCS.glob("*.md"))
    flags = _reference().long_flags()
    assert set(flags) >= {"tfrun", "tfrun config", "tfrun report", "tfrun slurm", "tfrun k8s",
                          "tfrun doctor"}
    assert sum(len(v) for v in flags.values()) >= 80  # the parsers were read
    missing = {cmd: [f for f in found if not re.search(re.escape(f) + r"\b", text)]
               for cmd, found in flags.items()}
    assert {cmd: m for cmd, m in missing.items() if m} == {}


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_relative_link_resolves():
    pages = [ROOT / "README.md", *DOCS.glob("*.md")]
    broken = []
    for page in pages:
        for target in _LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor on the page itself
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert broken == []
    assert sum(len(_LINK.findall(p.read_text())) for p in pages) >= 20  # links were found


def test_the_readme_is_a_front_page_and_the_docs_hold_the_rest():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    pages = sorted(p.name for p in DOCS.glob("*.md"))
    assert len(pages) >= 10, pages
    linked = set(re.findall(r"\(docs/([\w-]+\.md)\)", readme))
    assert linked == set(pages), "every docs page is reachable from the README's table"


def test_the_migration_page_names_every_foreign_flag_tfrun_refuses():
    from tfrun.cli.run import FOREIGN_FLAGS

    text = (DOCS / "migrating.md").read_text()
    assert [flag for flag in FOREIGN_FLAGS if f"`{flag}" not in text] == []


@pytest.mark.parametrize("page", ["api-reference.md", "variables-reference.md"])
def test_the_api_and_variables_references_are_generated_and_current(page):
    """Issue 45.4: the Python API reference is every name of tfrun.__all__ with its
    docstring, the variables reference every TFRUN_* name of the contract."""
    render = _script("docs_reference").PAGES[page]
    assert (DOCS / page).read_text() == render(), (
        f"docs/{page} is out of date: python3 scripts/docs_reference.py")


def test_every_public_name_and_every_variable_is_in_the_references():
    import tfrun
    import tfrun.contract

    api = (DOCS / "api-reference.md").read_text()
    assert [n for n in tfrun.__all__ if f"## `tfrun.{n}`" not in api] == []
    variables = (DOCS / "variables-reference.md").read_text()
    names = [getattr(tfrun.contract, n) for n in tfrun.contract.__all__
             if isinstance(getattr(tfrun.contract, n), str)
             and re.fullmatch(r"TFRUN_[A-Z0-9_]+", getattr(tfrun.contract, n))]
    assert len(names) > 30 and [v for v in names if f"| `{v}` |" not in variables] == []
    assert "object at 0x" not in api  # (a default's address would change every build)


def test_the_site_builds_strictly_with_every_page_in_its_navigation():
    """Issue 45: the documentation site (MkDocs, Material) is built from docs/ with
    warnings as errors -- a broken link or anchor, a page left out of the navigation."""
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    _Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *_: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)

    def pages(nav):
        for entry in nav:
            value = next(iter(entry.values()))
            yield from (pages(value) if isinstance(value, list) else [value])

    assert sorted(pages(config["nav"])) == sorted(p.name for p in DOCS.glob("*.md"))
    if not (ROOT / ".cache" / "mermaid" / "node_modules" / "mermaid").is_dir():
        pytest.skip("needs Mermaid, which the site ships (.ci/run: npm install --prefix "
                    ".cache/mermaid ...)")
    site = Path(os.environ.get("TMPDIR", "/tmp")) / "tfrun-site-test"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    # Issue 70.13: the diagrams draw offline: every page with one loads the Mermaid the
    # site ships, and no page loads a script from another host.
    assert (site / "javascripts" / "mermaid.min.js").stat().st_size > 100_000
    drawn = [page for page in site.rglob("*.html") if 'class="mermaid"' in page.read_text()]
    assert len(drawn) >= 3, drawn
    for page in drawn:
        text = page.read_text()
        assert re.search(r'<script src="[./]*javascripts/mermaid\.min\.js"', text), page
        assert not re.search(r'<script[^>]+src="(?:https?:)?//', text), page


def test_the_exit_code_table_says_what_the_code_does():
    from tfrun.errors import ConfigError, TfrunError
    from tfrun.launch.supervise.policy import LOST_EXIT_CODE, USAGE_ERROR_EXIT_CODE
    from tfrun.launch.supervise.records import HANG_TIMEOUT_EXIT_CODE, JOIN_TIMEOUT_EXIT_CODE

    sections = (DOCS / "exit-codes.md").read_text().split("\n## ")
    launch, task = ({line.split("|")[1].strip(): line for line in section.splitlines()
                     if line.startswith("| `")}
                    for section in (sections[1], sections[2]))  # tfrun's codes, a task's
    assert ConfigError.exit_code == USAGE_ERROR_EXIT_CODE == 2
    assert "bad input" in launch["`2`"] and "`usage`" in task["`2`"]
    assert "another error" in launch[f"`{TfrunError.exit_code}`"]
    assert JOIN_TIMEOUT_EXIT_CODE == HANG_TIMEOUT_EXIT_CODE == 124
    assert "never formed" in launch["`124`"] and "no progress" in launch["`124`"]
    assert "node-lost" in task[f"`{LOST_EXIT_CODE}` with a lost connection"]


def test_every_example_is_indexed_with_its_command():
    text = (DOCS / "examples.md").read_text()
    examples = sorted(p.name for p in (ROOT / "examples").glob("[!_]*.py"))
    assert len(examples) >= 5
    assert [e for e in examples if not re.search(rf"`{e}`.*`tfrun .*examples/{e}", text)] == []


def test_every_diagram_renders_and_a_broken_one_is_named(tmp_path, monkeypatch):
    """The figures are Mermaid source in the pages; each must parse and render (with the
    library GitHub and the site draw them with), and a syntax error names its page."""
    diagrams = _script("check_diagrams")
    prefix = ROOT / ".cache" / "mermaid"
    if not (prefix / "node_modules" / "mermaid").is_dir() or not shutil.which("chromium"):
        pytest.skip("needs Mermaid (.ci/run: npm install --prefix .cache/mermaid ...) "
                    "and Chromium")
    assert len(diagrams.diagrams()) >= 6
    assert diagrams.check(prefix) == [f"{page}: ok" for page, _ in diagrams.diagrams()]
    (tmp_path / "broken.md").write_text("```mermaid\nsequenceDiagram\n  A->>B: one; two\n"
                                        "  Note over A: x;y\n```\n")
    monkeypatch.setattr(diagrams, "DOCS", tmp_path)
    [line] = diagrams.check(prefix)
    assert line.startswith("broken.md: ERROR"), line


def test_every_source_path_a_page_names_exists():
    """Issue 45.9: pages named src/tfrun/... files that had moved."""
    named = {m.rstrip(".") for page in [ROOT / "README.md", *DOCS.glob("*.md")]
             for m in re.findall(r"src/tfrun/[\w/.]+", page.read_text())}
    assert len(named) >= 5
    assert sorted(p for p in named if not (ROOT / p).exists()) == []


def test_every_dockerfile_in_the_docs_has_comments_only_on_lines_of_their_own():
    """Docker reads ``COPY tfrun/ /src/tfrun/   # a checkout`` as three more sources, not a
    comment: a comment is a line that starts with ``#``. Every Dockerfile the user pages
    show (a block whose first instruction is FROM) keeps to that."""
    import re

    found = 0
    for page in sorted(DOCS.glob("*.md")):
        lines = page.read_text().splitlines()
        for at, line in enumerate(lines):
            if not re.match(r"\s*FROM \S", line):
                continue
            found += 1
            indent = len(line) - len(line.lstrip())
            for follow in lines[at:]:
                text = follow.strip()
                if not text or text.startswith("```") or (len(follow) - len(follow.lstrip())
                                                          < indent):
                    break
                assert text.startswith("#") or " #" not in text, (page.name, follow)
                assert re.match(r"(#|[A-Z]+ )", text), (page.name, follow)  # an instruction
    assert found >= 1


#: What history looks like in prose: a date, a commit hash next to a word that introduces
#: one, a CI run's number. (A run directory's name, ``runs/20261122-101500-train``, is none.)
_HISTORY = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"
                      r"|\b(?:at|since|until|before|after|commit|in)\s+`?[0-9a-f]{7,40}\b"
                      r"|\bci\d{2,3}\b|\bthe (?:night|evening|morning) of\b")


def test_the_pages_hold_no_history():
    """README and the docs are for users and maintainers: no dates, commit hashes or CI run
    numbers (history is in git, measurements in benchmarks.md with their commands)."""
    found = [f"{page.relative_to(ROOT)}:{number}: {match.group(0)}"
             for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
             for number, line in enumerate(page.read_text().splitlines(), 1)
             for match in _HISTORY.finditer(line)]
    assert found == [], found
    assert _HISTORY.search("measured at 8a22c6f") and _HISTORY.search("ci94 failed")
    assert _HISTORY.search("on 2026-11-27") and not _HISTORY.search("runs/20261122-101500-x")


def test_page_titles_match_the_menu_and_no_heading_skips_a_level():
    """Issue 70.15: a page's title is its entry in the site's menu (a subtitle may follow
    a colon), and its headings go down one level at a time."""
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    _Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *_: None)
    nav = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)["nav"]

    def entries(items):
        for entry in items:
            (title, value), = entry.items()
            yield from (entries(value) if isinstance(value, list) else [(title, value)])

    wrong, skipped = [], []
    for title, page in entries(nav):
        lines = (DOCS / page).read_text().splitlines()
        heading = lines[0][2:] if lines[0].startswith("# ") else ""
        if page != "index.md" and heading != title and not heading.startswith(title + ":"):
            wrong.append(f"{page}: {heading!r} in the menu as {title!r}")
        level, in_code = 0, False
        for number, line in enumerate(lines, 1):
            in_code ^= line.startswith("```")
            found = None if in_code else re.match(r"(#{1,6}) ", line)
            if found:
                if len(found.group(1)) > level + 1:
                    skipped.append(f"{page}:{number}: {line}")
                level = len(found.group(1))
    assert wrong == [] and skipped == [], (wrong, skipped)
