import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("VOLTA_ML_SHARED", REPO.parent / "shared"))


def shared_path(*parts: str) -> Path:
    """A path under ../shared, or skip the test with a reason when the reference material is absent."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"reference material {p} not available (../shared is beside the checkout in CI only)")
    return p


def env_folders(var: str, default: Path) -> list[Path]:
    """Folders named in an os.pathsep-separated environment variable, else the default if it exists."""
    raw = os.environ.get(var)
    folders = [Path(p) for p in raw.split(os.pathsep) if p] if raw else [default]
    return [f for f in folders if f.is_dir()]
