"""MkDocs hooks (``hooks:`` in mkdocs.yml): the site ships the Mermaid library its diagrams
are drawn with, so that they draw offline (air-gapped clusters, many HPC sites).

Material for MkDocs loads Mermaid from a CDN when a page has a diagram, unless a global
``mermaid`` is already defined; this adds the copy that ``npm install --prefix .cache/mermaid
mermaid@11.17.2`` fetched (``.ci/run`` does it) to every page, and copies it into the site.
Without that copy the build warns (``--strict``: fails) and says how to get it.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / ".cache" / "mermaid" / "node_modules" / "mermaid" / "dist" / "mermaid.min.js"
#: Where the copy goes in the site, and the script every page loads.
SHIPPED = "javascripts/mermaid.min.js"

log = logging.getLogger("mkdocs.hooks.mermaid")


def on_config(config):
    config.extra_javascript.append(SHIPPED)
    return config


def on_post_build(config) -> None:
    if not LIBRARY.is_file():
        log.warning(f"{LIBRARY} not found: the site's diagrams would not draw. Fix: npm "
                    "install --prefix .cache/mermaid mermaid@11.17.2 (once), then build again")
        return
    target = Path(config.site_dir) / SHIPPED
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(LIBRARY, target)
