"""The entry points' log handler: VOLTA's format on the current stderr, and nobody else's handler touched.

A program that embeds a volta-ml entry point (or pytest, whose log capture attaches its own handler)
keeps its handlers as they are: only the handler created here is added, once per logger. It writes to
whatever `sys.stderr` is when a line is logged (IGLUE's scrapers read the lines from the job's .err
file; a test or an embedding program may swap sys.stderr between runs).
"""
from __future__ import annotations

import logging
import sys

LOG_FORMAT = "%(asctime)s - %(levelname)s - %(name)s -   %(message)s"
DATE_FORMAT = "%m/%d/%Y %H:%M:%S"


class CurrentStderrHandler(logging.StreamHandler):
    """A StreamHandler bound to `sys.stderr` as it is at each emit, never to a stream that may be closed."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):  # StreamHandler.__init__/setStream assign it; the current stderr always wins
        pass


def attach_stderr_handler(logger: logging.Logger, level: int) -> logging.Handler:
    """Give `logger` volta-ml's stderr handler (created once) and `level`; other handlers stay as they are."""
    handler = next((h for h in logger.handlers if isinstance(h, CurrentStderrHandler)), None)
    if handler is None:
        handler = CurrentStderrHandler()
        handler.setFormatter(logging.Formatter(LOG_FORMAT, datefmt=DATE_FORMAT))
        logger.addHandler(handler)
    logger.setLevel(level)
    return handler
