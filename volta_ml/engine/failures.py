"""How a run ends when something goes wrong: one line on stderr, an exit code, nothing left running.

`fail(error, prog)` is what every entry point (train_task.py, eval_task.py, eval_retrieval.py and
their `volta-ml` subcommands) does with an error that ends the run: it stops the DataLoader
workers (they ignore SIGTERM on purpose, see `train_support`), leaves the process group without a
collective (`distributed.abort`), prints a traceback only for errors that are not the user's input,
and prints the cause as the last stderr line, `<prog>: error: <cause>`. The exit codes
(`EXIT_CODES`) are listed in docs/training.md, "When things go wrong".
"""
from __future__ import annotations

import gc
import multiprocessing
import os
import re
import signal
import sys
import traceback

EXIT_CRASH, EXIT_USAGE, EXIT_NON_FINITE, EXIT_WRITE, EXIT_INTERRUPTED = 1, 2, 3, 4, 130
EXIT_CODES = {
    0: "finished",
    EXIT_CRASH: "crashed: an error in the model, the data, a DataLoader worker or another rank "
                "(a traceback precedes the last line)",
    EXIT_USAGE: "usage error: a bad flag, path, file or config entry (one line, no traceback)",
    EXIT_NON_FINITE: "the training loss became NaN or infinite (the weights of that step are not saved)",
    EXIT_WRITE: "a checkpoint or result file could not be written (disk full, read-only, quota); "
                "the previous file of that name is unchanged",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
    "128+N": "stopped by signal N after saving the resume file (143 for SIGTERM, 138 for SIGUSR1)",
}
# errors of the disk, not of the program (volta_ml.atomic.DISK_ERRNOS): no traceback, exit code 4


# Errors caused by inputs (files, flags, configs), by module: reported as one line, exit code 2
USER_ERRORS = {
    "volta_ml.data": ("AnnotationError", "TokenizerLoadError"),
    "volta_ml.features.records": ("MissingImageError",),
    "volta_ml.devices": ("DeviceError",),
    "volta_ml.tasks.config": ("TaskConfigError",),
    "volta_ml.models": ("CheckpointError", "ConfigError"),
    "volta_ml.features": ("FeatureStoreError",),
}


def user_errors() -> tuple[type[BaseException], ...]:
    """The input-error classes of the modules loaded so far (an error of a module never loaded cannot occur,
    and classifying an error must not import torch)."""
    errors = [FileNotFoundError, UsageError]
    for module_name, names in USER_ERRORS.items():
        module = sys.modules.get(module_name)
        errors += [getattr(module, name) for name in names if hasattr(module, name)]
    return tuple(errors)


class UsageError(ValueError):
    """A flag or file combination that cannot work, found before any work is done (exit code 2)."""


# What a rank's collective or store call says when *another* rank died, hung or aborted. Only these make an
# error "another process failed" (no traceback here: the peer's log has it); any other gloo/NCCL error, a local
# CUDA or NCCL fault included, is this rank's crash and keeps its traceback.
PEER_FAILURE_MESSAGES = (
    "Connection closed by peer",              # gloo: the peer's socket closed (it exited)
    "Connection reset by peer",               # gloo / TCPStore: ECONNRESET from a dead peer
    "Connection was likely closed",           # TCPStore: "Failed to recv, got 0 bytes. Connection was likely closed."
    "Timed out waiting",                      # gloo: "Timed out waiting <n>ms for recv operation to complete"
    "remote process exited",                  # NCCL ncclRemoteError: "remote process exited or there was a network error"
    "a remote process exiting prematurely",   # torch's text for ncclRemoteError
    "Watchdog caught collective operation timeout",   # NCCL watchdog: a peer stopped joining collectives
    "Some NCCL operations have failed or timed out",  # NCCL watchdog's tear-down message after such a timeout
    "NCCL communicator was aborted",          # the communicator was aborted (a peer's abort, or the watchdog's)
)


def _is_peer_failure(error: BaseException) -> bool:
    """A collective or store call that failed because another rank died, hung or aborted (the known gloo, NCCL
    and TCPStore messages above; a RuntimeError or one of torch.distributed's errors, which derive from it)."""
    text = str(error)
    return isinstance(error, RuntimeError) and any(marker in text for marker in PEER_FAILURE_MESSAGES)


def _first_lines(error: BaseException) -> str:
    """The cause in one line: a DataLoader worker's re-raised error keeps its first and last line."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    if len(lines) > 1 and "worker" in lines[0]:
        return f"{lines[0]} {lines[-1]}"
    return lines[0]


# torch's re-raise of an error a DataLoader worker raised (torch._utils.ExceptionWrapper): the original's class
# when it can be built from one message, else RuntimeError; the message is the worker's whole traceback
_WORKER_ERROR = re.compile(r"Caught (\w+) in DataLoader worker process \d+\.\nOriginal Traceback")


def worker_error(error: BaseException) -> tuple[type, str] | None:
    """(class, message) of the error a DataLoader worker raised, when `error` is torch's re-raise of it: read from
    the last line of the worker's traceback that names that class (`<module>.<qualname>: <message>`, the message
    possibly on several lines), the class looked up among the modules loaded here. None for any other error."""
    text = str(error.args[0]) if error.args else ""
    match = _WORKER_ERROR.match(text)
    if match is None:
        return None
    lines = text.splitlines()
    head = re.compile(rf"((?:[A-Za-z_][\w.]*\.)?{re.escape(match.group(1))})(?:: |$)")
    for at in range(len(lines) - 1, 1, -1):
        found = head.match(lines[at])
        if found is None:
            continue
        module, _, name = found.group(1).rpartition(".")
        cls = getattr(sys.modules.get(module or "builtins"), name, None)
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            return None
        return cls, "\n".join([lines[at][found.end():], *lines[at + 1:]])
    return None


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


def describe(error: BaseException) -> tuple[int, str]:
    """(exit code, one-line cause) of an error that ended a run; an input error a DataLoader worker raised is told
    as the same line as without workers."""
    if isinstance(error, KeyboardInterrupt):
        return EXIT_INTERRUPTED, "interrupted"
    original = worker_error(error)
    if original is not None and issubclass(original[0], user_errors()):
        return EXIT_USAGE, _one_line(original[1])
    if isinstance(error, user_errors()):
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        return EXIT_USAGE, _one_line(message)
    from volta_ml.atomic import DISK_ERRNOS, WriteError
    if isinstance(error, WriteError) or (isinstance(error, OSError) and error.errno in DISK_ERRNOS):
        return EXIT_WRITE, str(error)
    if isinstance(error, (PermissionError, NotADirectoryError, IsADirectoryError, FileExistsError)):
        return EXIT_USAGE, str(error)  # a path the user named that cannot be used as such
    if _is_peer_failure(error):
        detail = re.sub(r"^\[[^\]]*\]\s*", "", _first_lines(error)).split(". ")[0]  # no C++ source location
        return EXIT_CRASH, f"another process of the job failed or stopped responding (its log names the cause): {detail}"
    return EXIT_CRASH, f"{type(error).__name__}: {_first_lines(error)}"


def _dataloader_workers() -> list:
    """The live workers of this process's DataLoader iterators (no other child process is touched; a
    started Process no longer records its target, so the iterators are looked up)."""
    module = sys.modules.get("torch.utils.data.dataloader")  # never imported: no DataLoader ran
    if module is None:
        return []
    iterator_type = module._MultiProcessingDataLoaderIter
    return [worker for obj in gc.get_objects() if issubclass(type(obj), iterator_type)  # no __class__ lookup
            for worker in getattr(obj, "_workers", ()) if worker.is_alive()]


def stop_workers(timeout: float = 5.0, at_exit: bool = False) -> None:
    """SIGKILL and reap this process's DataLoader workers (at interpreter exit: every daemon child, which
    multiprocessing's own exit hook would SIGTERM anyway).

    Workers ignore SIGTERM (a Slurm pre-emption signal must not kill them before the main
    process saved), so multiprocessing's exit hook, which sends SIGTERM and waits, would wait
    forever. PyTorch's SIGCHLD handler raises "DataLoader worker ... is killed" as soon as one
    of them dies, which would stop this loop half-way: it is switched off while we reap.
    """
    try:
        previous = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    except ValueError:  # not the main thread: PyTorch installed no handler here either
        previous = None
    try:
        children = ([c for c in multiprocessing.active_children() if c.daemon] if at_exit
                    else _dataloader_workers())
        for child in children:
            child.kill()
        for child in children:
            child.join(timeout=timeout)
    finally:
        if previous is not None:
            signal.signal(signal.SIGCHLD, previous)


def _close_progress_bars() -> None:
    """Close the progress bars the error left open, so that the cause stays the last stderr line."""
    from tqdm import tqdm
    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()


def die_with_parent(worker_id: int = 0) -> None:
    """DataLoader `worker_init_fn`: the kernel SIGKILLs this worker when its main process dies, however it
    dies (SIGKILL, OOM killer, a scheduler), instead of the worker noticing seconds later (Linux only)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def fail(error: BaseException, prog: str) -> int:
    """End a run after `error`: stop workers, leave the process group, report; returns the exit code."""
    code, cause = describe(error)
    if code == EXIT_CRASH and not _is_peer_failure(error):
        traceback.print_exception(error, file=sys.stderr)
    # Under torchrun / Slurm the cause is said before this rank leaves the group: once it has left, its peers'
    # collectives fail, they exit, and the launcher ends this rank too, possibly before a later line is written.
    # (One process: the cause stays the last stderr line.)
    ranks = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if ranks > 1:
        report(prog, cause)
    stop_workers()
    distributed = sys.modules.get("volta_ml.engine.distributed")  # the one module that starts process groups:
    if distributed is not None:                                    # never loaded, no group (torch stays unloaded)
        distributed.abort()
    if ranks == 1:
        report(prog, cause)
    return code


def report(prog: str, cause: str) -> None:
    """`<prog>: error: <cause>` as the last stderr line (open progress bars are closed first)."""
    _close_progress_bars()
    sys.stdout.flush()
    print(f"{prog}: error: {cause}", file=sys.stderr, flush=True)
