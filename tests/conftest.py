import os
import tempfile
from pathlib import Path

import pytest

from volta_ml.testing import reference

REPO = Path(__file__).resolve().parents[1]
SHARED = reference.shared_root()  # VOLTA_ML_SHARED, else ../shared: the one setting every test reads it through
# the per-file digest cache of resume fingerprints (volta_ml/digest.py): one per test session, not the user's
os.environ.setdefault("VOLTA_ML_DIGEST_CACHE", os.path.join(tempfile.mkdtemp(prefix="volta_ml_digests_"),
                                                            "file_digests.json"))


def shared_path(*parts: str) -> Path:
    """A path under the shared reference folder, or skip the test with a reason when it is absent."""
    p = reference.shared_path(*parts)
    if not p.exists():
        pytest.skip(f"reference material {p} not available (../shared is beside the checkout in CI only; "
                    f"set {reference.ENV} to use another copy)")
    return p


def env_folders(var: str, sub: str) -> list[Path]:
    """Fixture folders named in an os.pathsep-separated environment variable, else `<shared>/<sub>` if it exists."""
    return reference.fixture_folders(var, sub)
