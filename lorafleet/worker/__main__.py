"""``python -m lorafleet.worker``: run one worker process."""

from __future__ import annotations

import sys

import uvloop

from lorafleet.process.logs import configure_logging
from lorafleet.process.parent_death import watch_parent
from lorafleet.worker.config import parse_worker_args
from lorafleet.worker.runtime import run_worker


def main(argv: list[str] | None = None) -> int:
    """Parse flags and environment, run the worker, return its exit code."""
    watch_parent()  # where the kernel cannot end us with our parent (process.parent_death)
    config = parse_worker_args(argv)
    configure_logging(process=f"worker:{config.engine}")
    return uvloop.run(run_worker(config))


if __name__ == "__main__":
    sys.exit(main())
