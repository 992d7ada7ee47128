"""The one version number: `hf_elmo.__version__` (the version the package is built with) is CHANGELOG.md's newest
heading: that release itself, or a development version of it while the heading says "unreleased"."""

import re
from pathlib import Path

from packaging.version import Version

import hf_elmo


def test_the_version_is_the_changelogs_newest_heading():
    changelog = (Path(__file__).parents[1] / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (\S+)(.*)$", changelog, flags=re.MULTILINE)
    assert headings, "CHANGELOG.md has no version heading"
    newest, rest = Version(headings[0][0]), headings[0][1]
    version = Version(hf_elmo.__version__)
    if "unreleased" in rest:
        assert version.is_devrelease and Version(version.base_version) == newest, (hf_elmo.__version__, headings[0])
    else:
        assert version == newest, (hf_elmo.__version__, headings[0])
    assert all(Version(older) < newest for older, _ in headings[1:]), headings
