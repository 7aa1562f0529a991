"""The README's Layout block names every package of src/stoker/ and every folder of tests/ that holds tests
(issue 34 item 21: it had left out cards/, runner/ and recipes/)."""

from __future__ import annotations

import re

from tests.helpers import ROOT


def _layout() -> str:
    text = (ROOT / "README.md").read_text()
    return re.search(r"^## Layout\n+```\n(.*?)```", text, re.S | re.M).group(1)


def test_the_layout_names_every_package():
    listed = set(re.search(r"src/stoker/\{([^}]*)\}/", _layout()).group(1).split(","))
    packages = {p.name for p in (ROOT / "src" / "stoker").iterdir() if (p / "__init__.py").is_file()}
    assert packages - listed == set(), f"the README's Layout block leaves out {sorted(packages - listed)}"
    assert listed - packages == set(), f"the README's Layout block names {sorted(listed - packages)}, not packages"


def test_the_layout_names_every_test_folder():
    line = next(ln for ln in _layout().splitlines() if ln.startswith("tests/"))
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and any(p.rglob("test_*.py"))}
    assert {f for f in folders if f"{f}/" not in line} == set(), line
