#!/usr/bin/env python3
"""Build the loopback bind library tfrun ships, reproducibly, or check the shipped copy.

    python3 scripts/build_loopback_bind.py          # writes the .so and its .sha256
    python3 scripts/build_loopback_bind.py --check  # rebuilds in a temporary directory and
                                                    # compares the bytes with the shipped copy

The toolchain is pinned (Debian 12's gcc 12.2.0 and binutils 2.40; the flags are
``tfrun.launch.network.loopback.BUILD_FLAGS``, the same a user's machine compiles with): with it,
anyone gets the shipped bytes, so the binary can be checked against its source. The
``.sha256`` names both hashes (``cd src/tfrun/launch && sha256sum -c
_loopback_bind.x86_64.sha256``); tfrun refuses a binary whose hash differs from it.
Exit status: 0 built (or identical), 1 different bytes, 2 not the pinned toolchain.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tfrun.launch.network.loopback import SOURCE, compile_command  # noqa: E402

#: The toolchain of the shipped copy: (command, its version as asked, the version wanted).
PINNED = (("gcc", ["gcc", "-dumpfullversion"], "12.2.0"),
          ("ld", ["ld", "--version"], "GNU ld (GNU Binutils for Debian) 2.40"),
          ("strip", ["strip", "--version"], "GNU strip (GNU Binutils for Debian) 2.40"))


def toolchain_problems() -> list[str]:
    """What differs from the pinned toolchain (empty: it is the pinned one)."""
    problems = []
    for name, command, wanted in PINNED:
        if shutil.which(command[0]) is None:
            problems.append(f"{name} is not installed (wanted: {wanted})")
            continue
        first = subprocess.run(command, capture_output=True, text=True).stdout.splitlines()[:1]
        if first != [wanted]:
            problems.append(f"{name} is {first[0] if first else '?'!r}, not {wanted!r}")
    return problems


def build(directory: Path) -> Path:
    """The library built from the source, stripped, in ``directory``."""
    machine = os.uname().machine
    source = directory / SOURCE.name  # the same path every time: nothing of the tree leaks in
    shutil.copyfile(SOURCE, source)
    out = directory / f"_loopback_bind.{machine}.so"
    subprocess.run(compile_command("gcc", source.name, out.name, warnings=("-Wall", "-Werror")),
                   cwd=directory, check=True)
    subprocess.run(["strip", "--strip-all", "--remove-section=.comment", out.name],
                   cwd=directory, check=True)
    symbols = subprocess.run(["objdump", "-T", out.name], cwd=directory, check=True,
                             capture_output=True, text=True).stdout
    newer = [line for line in symbols.splitlines() if "GLIBC_2." in line
             and "GLIBC_2.2.5" not in line]
    if newer:
        raise SystemExit("needs a glibc symbol newer than 2.2.5:\n" + "\n".join(newer))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="rebuild and compare with the shipped copy; write nothing")
    args = parser.parse_args()
    problems = toolchain_problems()
    if problems:
        print("not the pinned toolchain: " + "; ".join(problems) + ". Build in Debian 12 "
              "(apt-get install gcc-12 binutils), where gcc is 12.2.0.", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="tfrun-loopback-build-") as scratch:
        built = build(Path(scratch))
        shipped = SOURCE.with_name(built.name)
        if args.check:
            same = shipped.exists() and shipped.read_bytes() == built.read_bytes()
            print(f"{shipped.name}: {'identical to' if same else 'DIFFERENT from'} a rebuild "
                  f"(sha256 {hashlib.sha256(built.read_bytes()).hexdigest()})")
            return 0 if same else 1
        shutil.copyfile(built, shipped)
    digest = SOURCE.with_name(shipped.name.replace(".so", ".sha256"))
    digest.write_text("".join(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}\n"
                              for path in (shipped, SOURCE)))
    print(f"built {shipped.name} ({shipped.stat().st_size} bytes) and {digest.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
