"""`engine/failures`: which errors are another rank's failure (one line, no traceback here) and which are this
rank's crash (traceback kept). The multi-process drills are in test_failure_drills.py."""
from __future__ import annotations

import pytest
import torch.distributed as dist

from volta_ml.engine.failures import EXIT_CRASH, _is_peer_failure, describe, fail

PEER_MESSAGES = [
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:34567",
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Read error [127.0.0.1]:2: Connection reset by peer",
    "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 600000ms for recv operation "
    "to complete",
    "Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?",
    "NCCL error in: ProcessGroupNCCL.cpp:3356, remote process exited or there was a network error, NCCL version "
    "2.27.3\nncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
    "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran for 600000 "
    "milliseconds before timing out.",
    "NCCL communicator was aborted on rank 0.",
]
LOCAL_MESSAGES = [   # this rank's own faults: they name NCCL or gloo, but no other process is involved
    "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL "
    "version 2.27.3\nncclUnhandledCudaError: Call to CUDA function failed.",
    "NCCL error in: ProcessGroupNCCL.cpp:3356, invalid usage (run with NCCL_DEBUG=WARN for details)",
    "[../third_party/gloo/gloo/allreduce.cc:140] Gloo allreduce: tensor size mismatch",
]


@pytest.mark.parametrize("kind", [RuntimeError, dist.DistBackendError, dist.DistStoreError])
@pytest.mark.parametrize("message", PEER_MESSAGES)
def test_known_peer_failure_messages(kind, message):
    error = kind(message)
    assert _is_peer_failure(error)
    code, cause = describe(error)
    assert code == EXIT_CRASH and cause.startswith("another process of the job failed or stopped responding")


@pytest.mark.parametrize("kind", [RuntimeError, dist.DistBackendError, dist.DistError])
@pytest.mark.parametrize("message", LOCAL_MESSAGES)
def test_a_local_nccl_or_gloo_error_keeps_its_traceback(kind, message, capsys):
    error = kind(message)
    assert not _is_peer_failure(error)
    try:
        raise error
    except RuntimeError as raised:
        assert fail(raised, "train_task.py") == EXIT_CRASH
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert err.strip().splitlines()[-1] == f"train_task.py: error: {kind.__name__}: {message.splitlines()[0]}"


def test_other_errors_are_not_peer_failures():
    assert not _is_peer_failure(ValueError("Connection reset by peer"))   # not from a collective
    assert not _is_peer_failure(RuntimeError("CUDA out of memory"))


def test_disk_error_is_found_behind_what_each_writer_raises():
    """A full disk as torch.save (an OSError under its RuntimeError), safetensors (Rust's `(os error 28)` text) and
    torch.distributed.checkpoint (a CheckpointException holding each failed rank's error) report it; other errors
    are not disk errors."""
    import errno
    import os

    from torch.distributed.checkpoint.api import CheckpointException

    from volta_ml.atomic import disk_error

    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    try:
        try:
            raise full
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0")
    except RuntimeError as wrapped:
        assert disk_error(wrapped) is full
    rust = disk_error(ValueError("Error while serializing: IoError(No space left on device (os error 28))"))
    assert rust is not None and rust.errno == errno.ENOSPC
    ranks = CheckpointException("save failed", {1: (RuntimeError("no"), None), 0: (full, None)})
    assert disk_error(ranks) is full
    assert disk_error(CheckpointException("save failed", {0: (RuntimeError("no"), None)})) is None
    assert disk_error(OSError(errno.EACCES, "Permission denied")) is None and disk_error(ValueError("x")) is None
