"""The docs cannot drift: the command-line reference is the parsers' own help, every long
flag is documented, every relative link resolves, and the README stays a front page."""

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _reference():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "scripts" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_is_generated_from_the_parsers_and_current():
    reference = _reference()
    assert (DOCS / "cli-reference.md").read_text() == reference.render(), (
        "docs/cli-reference.md is out of date: python scripts/cli_reference.py > "
        "docs/cli-reference.md")


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
