"""A damaged FSDP resume state is said to be damaged, another model's is said to be another model's, in one line and
with nothing of torch.distributed.checkpoint's own logging (its tracebacks) let through; on 1 rank (a process group
of one, in this process) and on 2 (gloo, one torchrun). The cases: a `.metadata` whose first bytes are garbage, the
`.distcp` data files cut in half, a model whose tensors have other shapes, the damaged `.metadata` reaching
torch.distributed.checkpoint's load itself (the check skipped), and the whole state (it loads, bit for bit).
"""
import json
import subprocess
import sys

import pytest
import torch.distributed as dist

from helpers_hf_train import REPO, train_env
from helpers_sharding_resume import CASES, run_cases
from helpers_train import free_port

HELPER = str(REPO / "tests" / "helpers_sharding_resume.py")


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    from volta_ml.engine.distributed import DistInfo
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        return run_cases(tmp_path_factory.mktemp("one_rank"), DistInfo(initialized=True))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("two_ranks") / "results.json"
    for _ in range(2):   # a port taken meanwhile: once more
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                               "--master_port", str(free_port()), HELPER, str(out)], env=train_env(),
                              capture_output=True, text=True, timeout=300)
        if done.returncode == 0 or "Address already in use" not in done.stderr:
            break
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


EXPECTED = {
    "metadata": r"its sharded state \S+ is damaged or unreadable \(\.metadata: ValueError: ",
    "cut": r"its sharded state \S+ is damaged or unreadable \(__\d_\d\.distcp: \d+ bytes, the metadata places data "
           r"up to byte \d+; cut short\?\)",
    "other": r"its sharded state \S+ holds another model's tensors: \d+ of another shape \(first model\.\S+: file "
             r"\[\d+(, \d+)?\], model \[\d+(, \d+)?\]\)",
    "unchecked": r"its sharded state \S+ is damaged or unreadable \(rank 0: AssertionError: metadata is None; global "
                 r"metadata read failed: invalid literal",
}


def _check(result: dict, case: str) -> None:
    import re
    assert not result["records"], result["records"]          # nothing logged: no traceback above the one line
    if case == "whole":
        assert result == {"loaded": True, "same": True, "records": []}
        return
    assert result["error"] == "UsageError", result
    message = result["message"]
    assert "\n" not in message and message.startswith("--resume_file ") and ": its sharded state " in message
    assert re.search(EXPECTED[case], message), message
    assert "does not fit" not in message
    assert ("another model" in message) == (case == "other"), message


@pytest.mark.parametrize("case", CASES)
def test_one_rank(one_rank, case):
    _check(one_rank[case], case)


@pytest.mark.parametrize("case", CASES)
def test_two_ranks(two_ranks, case):
    assert len(two_ranks) == 2
    for rank in two_ranks:                                     # both ranks refuse alike (none left waiting)
        _check(rank[case], case)
    assert two_ranks[0][case].get("message") == two_ranks[1][case].get("message")
