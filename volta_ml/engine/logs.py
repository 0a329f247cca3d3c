"""The entry points' log handler: VOLTA's format on the current stderr, and nobody else's handler touched.

A program that embeds a volta-ml entry point (or pytest, whose log capture attaches its own handler)
keeps its handlers as they are: only the handler created here is added once and re-pointed to the
stderr of the moment (IGLUE's scrapers read the log lines from the job's .err file).
"""
from __future__ import annotations

import logging
import sys

LOG_FORMAT = "%(asctime)s - %(levelname)s - %(name)s -   %(message)s"
DATE_FORMAT = "%m/%d/%Y %H:%M:%S"
_OWNED = "_volta_ml_stderr_handler"


def attach_stderr_handler(logger: logging.Logger, level: int) -> logging.Handler:
    """Give `logger` volta-ml's stderr handler (created once, then re-pointed) and `level`."""
    handler = next((h for h in logger.handlers if getattr(h, _OWNED, False)), None)
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
        setattr(handler, _OWNED, True)
        handler.setFormatter(logging.Formatter(LOG_FORMAT, datefmt=DATE_FORMAT))
        logger.addHandler(handler)
    else:
        with handler.lock:  # no setStream: it flushes the old stream, which may be closed by now
            handler.stream = sys.stderr
    logger.setLevel(level)
    return handler
