"""The README is a user's guide people read in a terminal: at most 300 lines of at most 100
characters, its first command the demo, verbatim; what it leaves out is in docs/reference.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_lines_fit_100_columns_and_it_stays_short() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, len(lines)
    long = [(n, len(line)) for n, line in enumerate(lines, 1) if len(line) > 100]
    assert not long, long


def test_readme_starts_with_the_demo_and_links_pages_that_exist() -> None:
    text = (ROOT / "README.md").read_text()
    first = text.split("```bash\n", 1)[1].splitlines()[0]
    assert first == ("python3 -m venv .venv && . .venv/bin/activate && pip install -e . && "
                     "spillway demo")
    for target in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / target).is_file(), target
    reference = (ROOT / "docs/reference.md").read_text()
    for code in ("NoFeasibleNode", "CloudOnly", "BudgetSoftCap", "DeferredForCarbon"):
        assert f"`{code}`" in text and f"`{code}`" in reference, code
