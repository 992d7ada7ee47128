"""The one version number: `hf_elmo.__version__` (the version the package is built with) is the latest release that
CHANGELOG.md heads, and the unreleased work there comes after it."""

import re
from pathlib import Path

from packaging.version import Version

import hf_elmo


def test_the_version_is_the_changelogs_latest_release():
    changelog = (Path(__file__).parents[1] / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (\S+)(.*)$", changelog, flags=re.MULTILINE)
    released = [Version(version) for version, rest in headings if "unreleased" not in rest]
    unreleased = [Version(version) for version, rest in headings if "unreleased" in rest]
    assert released, f"CHANGELOG.md heads no released version, only {headings}"
    assert Version(hf_elmo.__version__) == released[0], (hf_elmo.__version__, headings)
    assert all(version > released[0] for version in unreleased), headings
