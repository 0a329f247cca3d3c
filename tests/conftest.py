import os
import tempfile
from pathlib import Path

import pytest

from volta_ml.testing import reference

REPO = Path(__file__).resolve().parents[1]
# `pytest -n N` (pytest-xdist): the N workers share the cores, so each takes its share of threads, it and the
# processes its tests start (OMP_NUM_THREADS is read when torch is first imported, after this file)
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ.setdefault("OMP_NUM_THREADS",
                          str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))
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


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models and matrices run fastest single-threaded, and keep a shared CI machine responsive; a module
    opts in with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --- the tests a run without ../shared did not run in full ---------------------------------------------------------
# With VOLTA_ML_NEEDS_SHARED_LOG set (.ci/run's fresh-clone pass), every test that skipped, and every test marked
# `reads_shared` (it reads ../shared when present and falls back to generated data otherwise), is appended to that
# file as its `path::function` (parameters dropped: the parameter sets of a fixture folder differ once it is
# there), and every other test that passed to VOLTA_ML_PASSED_LOG as its full node id. CI's second pass runs those
# functions with ../shared, VOLTA_ML_PASSED_LOG naming the first pass's file: the parameter sets that already passed
# there without reading the reference material are deselected (running them again would only repeat the first
# pass), so one skipped case of a parametrized test does not run all its other cases twice.
NEEDS_SHARED_LOG = "VOLTA_ML_NEEDS_SHARED_LOG"
PASSED_LOG = "VOLTA_ML_PASSED_LOG"


def pytest_configure(config):
    config.addinivalue_line("markers", "reads_shared: reads ../shared when present, generated data otherwise "
                                       "(CI runs it both ways)")
    config.addinivalue_line("markers", "vllm: needs vLLM (skipped where it is not importable); CI runs `pytest -m "
                                       "vllm` in the environment of scripts/install_vllm_env.sh")


def pytest_runtest_logreport(report):
    log, passed = os.environ.get(NEEDS_SHARED_LOG), os.environ.get(PASSED_LOG)
    if not log or report.when not in ("setup", "call"):
        return
    if report.skipped or (report.when == "setup" and "reads_shared" in report.keywords):
        with open(log, "a", encoding="utf-8") as out:
            out.write(report.nodeid.split("[", 1)[0] + "\n")
    elif passed and report.when == "call" and report.passed and "reads_shared" not in report.keywords:
        with open(passed, "a", encoding="utf-8") as out:
            out.write(report.nodeid + "\n")


def pytest_collection_modifyitems(config, items):
    """The second pass (VOLTA_ML_PASSED_LOG set, VOLTA_ML_NEEDS_SHARED_LOG not): drop what the first one passed."""
    passed = os.environ.get(PASSED_LOG)
    if not passed or os.environ.get(NEEDS_SHARED_LOG) or not os.path.isfile(passed):
        return
    with open(passed, encoding="utf-8") as f:
        done = set(f.read().splitlines())
    keep = [item for item in items if item.nodeid not in done]
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid in done])
        items[:] = keep
