"""Where the reference material is: one setting for every test and benchmark that reads `../shared`.

`VOLTA_ML_SHARED` names the folder; unset, it is `shared/` beside the checkout (where CI puts it). A user's
fresh clone has none, and CI runs the suite first with `VOLTA_ML_SHARED` pointing at an empty folder:
every reader goes through these functions and skips (or reports "skipped") with the path it looked at.
The fixture folders keep their own variables (`VOLTA_ML_GOLDEN`, `VOLTA_ML_GOLDEN_EXTRACT`: os.pathsep-separated
lists) and default to their folder under the shared root. Read at call time, never at import time.
"""
from __future__ import annotations

import os
from pathlib import Path

ENV = "VOLTA_ML_SHARED"
CHECKOUT = Path(__file__).resolve().parents[2]


def shared_root() -> Path:
    """The reference folder: `$VOLTA_ML_SHARED`, else `shared/` beside the checkout (it may not exist)."""
    raw = os.environ.get(ENV)
    return Path(raw) if raw else CHECKOUT.parent / "shared"


def shared_path(*parts: str) -> Path:
    """A path under the shared root (it may not exist: callers check and skip with it in the reason)."""
    return shared_root().joinpath(*parts)


def fixture_folders(var: str, sub: str) -> list[Path]:
    """Folders named in the os.pathsep-separated variable `var`, else `<shared root>/<sub>`: those that exist."""
    raw = os.environ.get(var)
    folders = [Path(p) for p in raw.split(os.pathsep) if p] if raw else [shared_path(sub)]
    return [f for f in folders if f.is_dir()]
