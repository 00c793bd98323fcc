"""Check that every Mermaid diagram in docs/ parses and renders, in headless Chromium.

    npm install --prefix .cache/mermaid mermaid@11.17.2     # once (tests/unit/test_docs.py
    python3 scripts/check_diagrams.py .cache/mermaid        # and .ci/run do this)

The diagrams are source in the pages (```mermaid blocks), drawn by GitHub and by the
documentation site's browser: a syntax error would only show there, as an error box. This
renders each one with the same library and prints ``page: ok`` or ``page: ERROR ...``;
exit status 1 when any failed, 2 when Mermaid or Chromium is missing.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"
_BLOCK = re.compile(r"```mermaid\n(.*?)```", re.S)


def diagrams() -> list[tuple[str, str]]:
    """(page, source) of every diagram in docs/, in page order."""
    return [(page.name, match.group(1)) for page in sorted(DOCS.glob("*.md"))
            for match in _BLOCK.finditer(page.read_text())]


_PAGE = """<html><body><pre id="out">pending</pre>
<script src="%(library)s"></script><script>
const blocks = %(blocks)s;
mermaid.initialize({startOnLoad: false});
(async () => {
  const lines = [];
  for (const [i, [page, text]] of blocks.entries()) {
    try { await mermaid.parse(text); await mermaid.render("d" + i, text); lines.push(page + ": ok"); }
    catch (error) { lines.push(page + ": ERROR " + String(error.message).split("\\n").join(" ")); }
  }
  document.getElementById("out").textContent = "RESULTS\\n" + lines.join("\\n") + "\\nEND";
})();
</script></body></html>"""


def check(mermaid_prefix: Path) -> list[str]:
    """``page: ok`` / ``page: ERROR ...`` for each diagram."""
    library = mermaid_prefix / "node_modules" / "mermaid" / "dist" / "mermaid.min.js"
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not library.is_file() or browser is None:
        raise FileNotFoundError(f"needs {library} (npm install --prefix {mermaid_prefix} "
                                "mermaid@11.17.2) and Chromium")
    with tempfile.TemporaryDirectory(prefix="tfrun-diagrams-") as scratch:
        page = Path(scratch) / "check.html"
        page.write_text(_PAGE % {"library": library.resolve().as_uri(),
                                 "blocks": json.dumps(diagrams())})
        dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                              f"--user-data-dir={scratch}/profile", "--allow-file-access-from-files",
                              "--virtual-time-budget=20000", "--dump-dom", page.as_uri()],
                             capture_output=True, text=True, timeout=120, check=True).stdout
    found = re.search(r"RESULTS\n(.*?)\nEND", dom, re.S)
    if found is None:
        raise RuntimeError("Mermaid did not finish in the page: " + dom[-500:])
    return found.group(1).splitlines()


def main() -> int:
    try:
        lines = check(Path(sys.argv[1] if len(sys.argv) > 1 else ".cache/mermaid"))
    except FileNotFoundError as missing:
        print(missing, file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0 if all(line.endswith(": ok") for line in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
