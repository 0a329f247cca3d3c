"""`volta-ml sweep GRID --local`: run the cells here, one after the other, in stage order.

Finished cells are skipped; a cell whose dependencies did not finish is reported as blocked; a failed
cell does not stop the others. On SIGINT/SIGTERM the running command's process group is stopped and the
sweep exits without recording that cell, so running the same command again resumes where it stopped.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tqdm import tqdm

from .cell import Cell, is_done

TAIL_LINES = 15


class Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum


def _tail(path: str, n: int = TAIL_LINES) -> str:
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join("    " + l for l in lines[-n:])


class LocalRunner:
    def __init__(self, env: dict[str, str] | None = None, out=sys.stderr):
        self.env = {**os.environ, **(env or {})}
        self.out = out
        self.child: subprocess.Popen | None = None
        self.stop_signal: int | None = None

    def _on_signal(self, signum, frame):
        self.stop_signal = signum
        if self.child and self.child.poll() is None:
            try:
                os.killpg(self.child.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        raise Interrupted(signum)

    def run_command(self, command) -> int:
        Path(command.stdout).parent.mkdir(parents=True, exist_ok=True)
        with open(command.stdout, "ab") as out:
            err = out if command.combined else open(command.stderr, "ab")
            try:
                # own process group: an interrupt stops the command and everything it started
                self.child = subprocess.Popen(command.argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                              env=self.env, start_new_session=True)
                try:
                    return self.child.wait()
                except Interrupted:
                    try:
                        self.child.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        os.killpg(self.child.pid, signal.SIGKILL)
                        self.child.wait()
                    raise
            finally:
                self.child = None
                if err is not out:
                    err.close()

    def run_cell(self, cell: Cell) -> bool:
        cell.path.mkdir(parents=True, exist_ok=True)
        for log in cell.logs:                 # a rerun starts its logs afresh (scrapers read the last lines)
            Path(log).unlink(missing_ok=True)
        for command in cell.commands:
            code = self.run_command(command)
            if code != 0:
                shown = command.stderr if not command.combined else command.stdout
                print(f"\nFAILED {cell.id} (exit {code}): {' '.join(command.argv[:6])} ...\n  log {shown}:\n"
                      f"{_tail(shown)}", file=self.out)
                return False
        if not is_done(cell.path):
            print(f"\nFAILED {cell.id}: commands succeeded but no complete result.json was recorded", file=self.out)
            return False
        return True

    def run(self, cells: list[Cell], max_cells: int | None = None) -> dict[str, list[str]]:
        """Run the unfinished cells; returns ids by outcome: done, skipped (already finished), failed,
        blocked (a dependency did not finish)."""
        summary = {"done": [], "skipped": [], "failed": [], "blocked": []}
        finished = {c.id for c in cells if is_done(c.path)}
        known = {c.id for c in cells}
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        ran = 0
        try:
            with tqdm(cells, desc="sweep", unit="cell", file=self.out) as bar:
                for cell in bar:
                    bar.set_postfix_str(cell.id[-60:])
                    if cell.id in finished:
                        summary["skipped"].append(cell.id)
                        continue
                    if any(d in known and d not in finished for d in cell.depends_on):
                        summary["blocked"].append(cell.id)
                        continue
                    if max_cells is not None and ran >= max_cells:
                        break
                    ran += 1
                    if self.run_cell(cell):
                        finished.add(cell.id)
                        summary["done"].append(cell.id)
                    else:
                        summary["failed"].append(cell.id)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        return summary
