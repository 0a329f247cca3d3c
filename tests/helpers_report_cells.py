"""Reading the Markdown tables a report writes back, cell by cell: `bare_cells` finds every number shown without its
interval (`56.30 ± 1.20` and `56.30 [55.10, 57.50]` carry one; `56.30` does not), so a report test fails on any
accuracy / recall / CIDEr cell that lost its interval."""
from __future__ import annotations

import re
from pathlib import Path

BARE = re.compile(r"[+-]?\d+\.\d+")


def bare_cells(folder: Path, exempt_columns=(), exempt_rows=()) -> list[tuple[str, str, str, str]]:
    """(file, row name, column, cell) of every Markdown table cell under `folder` (its `*.md`) that is a decimal
    number alone, but in `exempt_columns` (numbers with no per-item data, p-values) or `exempt_rows`."""
    found = []
    for path in sorted(Path(folder).glob("*.md")):
        header = None
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.startswith("|"):
                header = None                       # a table ends at the first line that is not a row
                continue
            if re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", line.strip()):
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = cells
                continue
            found += [(path.name, cells[0], column, cell) for column, cell in zip(header, cells)
                      if BARE.fullmatch(cell) and column not in exempt_columns and cells[0] not in exempt_rows]
    return found
