"""What the deployment tests share."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture
def logging_as_it_was() -> Iterator[None]:
    """The loggers as they were before the test: an application instantiated in-process sets
    up its own (the host agent's "kernelfleet" logger stops propagating, so that later tests'
    caplog would see none of its records)."""
    loggers = [logging.root] + [
        logger
        for logger in logging.Logger.manager.loggerDict.values()
        if isinstance(logger, logging.Logger)
    ]
    saved = {logger: (logger.level, logger.propagate, logger.disabled, list(logger.handlers))
             for logger in loggers}  # fmt: skip
    yield
    for logger in list(logging.Logger.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger) and logger not in saved:  # made by the test
            saved[logger] = (logging.NOTSET, True, False, [])
    for logger, (level, propagate, disabled, handlers) in saved.items():
        logger.setLevel(level)
        logger.propagate, logger.disabled, logger.handlers = propagate, disabled, handlers
