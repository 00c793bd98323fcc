"""Write docs/cli-reference.md from tfrun's own argument parsers, so it cannot drift.

    python scripts/cli_reference.py > docs/cli-reference.md     # regenerate
    python scripts/cli_reference.py --check                     # CI: fails if it drifted

Every command's ``--help``, as argparse prints it at 100 columns (the path of this
machine's Python replaced by ``<python>``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from unittest import mock

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli-reference.md"


def parsers() -> list[tuple[str, argparse.ArgumentParser | None, str]]:
    """(command, its parser or None, text for a command that reads its argv by hand)."""
    from tfrun.cli import build_config_parser, build_report_parser
    from tfrun.cli.bench import USAGE, __doc__ as bench_doc
    from tfrun.cli.run import build_launch_parser
    from tfrun.launch.engines.kubernetes import _build_k8s_parser
    from tfrun.launch.engines.slurm.batch import _build_sbatch_parser

    bench = USAGE + "\n\n" + (bench_doc or "").split("\n\n", 1)[1].strip()
    doctor = build_launch_parser("tfrun doctor", "Check the hosts of an SSH launch before it "
                                 "starts. Takes tfrun's launch flags (above).")
    return [("tfrun", build_launch_parser(), ""),
            ("tfrun config", build_config_parser(), ""),
            ("tfrun bench", None, bench),
            ("tfrun report", build_report_parser(), ""),
            ("tfrun slurm", _build_sbatch_parser(), ""),
            ("tfrun k8s", _build_k8s_parser(), ""),
            ("tfrun doctor", doctor, "")]


def render() -> str:
    # argparse wraps to the terminal's width: one width everywhere, for this call only (a
    # test calls it in its own process, whose later runs would carry the width to their tasks).
    with mock.patch.dict(os.environ, {"COLUMNS": "100"}):
        return _render()


def _render() -> str:
    parts = ["# Command-line reference", "",
             "Generated from tfrun's argument parsers by `python scripts/cli_reference.py > "
             "docs/cli-reference.md`; CI checks that it matches. Every launch flag can also "
             "come from the environment: `--max-restarts 2` is `TFRUN_MAX_RESTARTS=2`.", ""]
    for command, parser, text in parsers():
        if parser is not None:
            # Before wrapping: a longer interpreter path must not move the line breaks.
            for action in parser._actions:
                if action.default == sys.executable:
                    action.default = "<python>"
        help_text = parser.format_help() if parser is not None else text
        help_text = help_text.replace(sys.executable, "<python>")
        parts += [f"## `{command}`", "", "```text", help_text.rstrip(), "```", ""]
    return "\n".join(parts)


def long_flags() -> dict[str, list[str]]:
    """Every long flag of every command (what the docs must name)."""
    return {command: sorted({s for a in parser._actions for s in a.option_strings
                             if s.startswith("--")})
            for command, parser, _ in parsers() if parser is not None}


def main() -> int:
    text = render()
    if sys.argv[1:] == ["--check"]:
        if DOC.read_text() != text:
            print(f"{DOC} is out of date: run python scripts/cli_reference.py > {DOC}",
                  file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
