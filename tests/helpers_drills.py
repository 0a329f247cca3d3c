"""Running a failure drill: a command that must end within 60 s, non-zero, with a one-line cause as the last
stderr line and no process of it left behind (tests/test_failure_drills*.py)."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

DEADLINE_S = 60
FAULT_TIME = re.compile(r"toy fault \w+ at (\d+\.\d+)")


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    ended: float        # time.time() when the command had exited
    leftovers: list

    @property
    def last_line(self) -> str:
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return lines[-1] if lines else ""

    def seconds_after_fault(self) -> float:
        """From the first injected fault (`toy fault ... at <time>` on stderr) to the command's end."""
        found = FAULT_TIME.findall(self.stderr)
        assert found, self.stderr[-2000:]
        return self.ended - min(float(t) for t in found)


def _tagged(tag: str) -> list[int]:
    """Processes whose environment carries `tag` (every descendant of the drill, whatever its session)."""
    needle = f"VOLTA_DRILL={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    with open(f"/proc/{entry}/stat", "rb") as stat:
                        if stat.read().split(b")")[-1].split()[0] != b"Z":
                            found.append(int(entry))
        except OSError:
            continue
    return found


def drill(argv, env: dict, cwd: Path, deadline: float = DEADLINE_S) -> Outcome:
    """Run `argv` and wait at most `deadline` seconds; whatever still runs of it afterwards is reported in
    `leftovers` (after a 2 s grace for the kernel to reap SIGKILLed workers) and then killed."""
    tag = uuid.uuid4().hex
    proc = subprocess.Popen(argv, cwd=cwd, env=dict(env, VOLTA_DRILL=tag), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"still running after {deadline} s: {argv}\n{err[-3000:]}") from None
    ended = time.time()
    left = _tagged(tag)
    for _ in range(20):
        if not left:
            break
        time.sleep(0.1)
        left = _tagged(tag)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return Outcome(proc.returncode, out, err, ended, left)


def assert_failed_cleanly(result: Outcome, code: int, cause: str) -> None:
    """Exit `code`, the cause as the last stderr line `<prog>: error: ...`, nothing left running."""
    assert result.returncode == code, result.stderr[-3000:]
    assert re.fullmatch(r"\S+( \S+)?: error: .+", result.last_line), result.stderr[-3000:]
    assert cause in result.last_line, result.last_line
    assert not result.leftovers, f"processes left behind: {result.leftovers}"


def userns_tmpfs_available() -> bool:
    """`unshare -rm` (a private mount namespace as mapped root) works: a tiny tmpfs can be mounted."""
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


FULL_DISK_SCRIPT = r'''
disk=$1; watch=$2; keep=$3; delay=$4; shift 4
mount -t tmpfs -o size=4m tmpfs "$disk" || exit 97
"$@" &
pid=$!
while [ ! -e "$watch" ] && kill -0 $pid 2>/dev/null; do sleep 0.02; done
sleep "$delay"
head -c 8000000 /dev/zero > "$disk/filler" 2>/dev/null    # the disk is full from here on
wait $pid; rc=$?
mkdir -p "$keep"; cp -a "$(dirname "$watch")"/. "$keep"/ 2>/dev/null; exit $rc
'''

READ_ONLY_SCRIPT = r'''
disk=$1; watch=$2; keep=$3; delay=$4; shift 4
"$@" &
pid=$!
while [ ! -e "$watch" ] && kill -0 $pid 2>/dev/null; do sleep 0.02; done
sleep "$delay"
chmod a-w "$(dirname "$watch")"                           # no new file can be created there
wait $pid; rc=$?
chmod u+w "$(dirname "$watch")"; mkdir -p "$keep"; cp -a "$(dirname "$watch")"/. "$keep"/; exit $rc
'''


def full_disk_argv(disk: Path, watch: Path, keep: Path, argv: list, delay: float = 0.0) -> list | None:
    """`argv` wrapped so that its output disk fills up (tiny tmpfs) or turns read-only (chmod, not as root)
    `delay` s after `watch` exists; watch's folder is copied to `keep` afterwards. None if neither works."""
    where = [str(disk), str(watch), str(keep), str(delay)]
    if userns_tmpfs_available():
        return ["unshare", "-rm", "sh", "-c", FULL_DISK_SCRIPT, "drill", *where, *argv]
    if os.geteuid() != 0:
        return ["sh", "-c", READ_ONLY_SCRIPT, "drill", *where, *argv]
    return None
