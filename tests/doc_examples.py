"""Running the Python examples of a documentation page (``from doc_examples import run_page``;
tests/ is on ``sys.path`` under pytest)."""

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def run_page(name: str) -> dict:
    """Execute every fenced ``python`` block of ``docs/<name>`` in order, in one namespace, and
    return the namespace; a page without such a block fails."""
    page = DOCS / name
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    assert blocks, f"{page} has no python example"
    namespace = {"__name__": f"docs.{page.stem}"}
    for block in blocks:
        exec(compile(block, str(page), "exec"), namespace)
    return namespace
