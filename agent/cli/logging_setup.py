"""The log of every `topolet` subcommand: one format, the level `--log-level` asks for."""

from __future__ import annotations

import logging

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str) -> None:
    """Log to stderr at `level` (one of LOG_LEVELS).

    urllib3 says WARNING for each connection retry inside one API call (two lines per call while the
    API server is down): the API loops log outages themselves (`agent.kubeapi.backoff`), so urllib3 is
    heard only at debug."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)
    if level != "debug":
        logging.getLogger("urllib3").setLevel(logging.ERROR)
