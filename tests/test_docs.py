"""The documentation site builds with `mkdocs build --strict` (a broken link, anchor, snippet or API reference, or a
docstring that fails to render, fails it), and its API reference documents every name `seqbert` exports."""

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import seqbert


ROOT = Path(__file__).resolve().parents[1]
API_PAGES = ("models", "cpu-inference", "data", "training", "hub", "conversion", "serving")


def test_the_site_builds_strict_and_documents_every_public_name(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's notice about MkDocs 2, printed on every build
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr}\n{result.stdout}"
    assert "WARNING" not in result.stderr, result.stderr

    pages = {name: (site / "api" / name / "index.html").read_text() for name in API_PAGES}
    # mkdocstrings gives each documented object an anchor named by its path: the API reference documents every name
    # of seqbert.__all__ under the name users import it by.
    anchors = {anchor for text in pages.values() for anchor in re.findall(r'id="([\w.]+)"', text)}
    missing = [name for name in seqbert.__all__ if f"seqbert.{name}" not in anchors]
    assert not missing, f"not in the API reference: {missing}"
    # ... with its docstring rendered (the first words of its summary), not only a heading.
    words = " ".join(re.findall(r"\w+", html.unescape(re.sub(r"<[^>]+>", " ", pages["models"]))))
    for name in seqbert.__all__:
        summary = " ".join(re.findall(r"\w+", getattr(seqbert, name).__doc__)[:6])
        assert summary in words, f"{name}: its docstring ({summary} ...) is not rendered"

    # The changelog page is CHANGELOG.md itself, every version of it.
    changelog = (site / "changelog" / "index.html").read_text()
    versions = re.findall(r"^## \[([^\]]+)\]", (ROOT / "CHANGELOG.md").read_text(), flags=re.M)
    assert versions and all(version in changelog for version in versions), versions
    # The figures the guides show are in the site.
    guides = "".join(page.read_text() for page in (ROOT / "docs").glob("*.md"))
    for image in re.findall(r"\]\((figures/[\w.-]+\.png)\)", guides):
        assert (site / image).is_file(), image
