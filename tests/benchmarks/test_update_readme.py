"""The README's benchmark table is what benchmarks/update_readme.py builds from the stored JSON
files: a figure edited by hand, or a file the table names and the repository lacks, fails here."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("update_readme", ROOT / "benchmarks/update_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_table_is_the_one_the_results_give():
    m = _module()
    text = (ROOT / "README.md").read_text()
    found = re.search(re.escape(m.START) + "\n(.*?)\n" + re.escape(m.END), text, flags=re.S)
    assert found, "README.md has no benchmark table"
    assert found.group(1).splitlines() == m.rows()


def test_every_file_the_table_names_is_stored():
    m = _module()
    for spec in m.ROWS:
        for name in spec[3].split(","):
            assert (ROOT / "benchmarks/results" / name.strip()).is_file(), name
