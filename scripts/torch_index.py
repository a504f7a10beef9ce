"""Print pip's ``--extra-index-url`` for PyTorch's CPU wheels, or nothing when unreachable.

The Makefile asks this before installing the ``hf`` extra, so that a CPU demo gets
CPU torch (hundreds of MB) instead of PyPI's CUDA build (gigabytes). One short
connect probe decides: when the index is unreachable (offline, a proxy, CI with
only a package mirror) pip runs with its own configuration and costs no retries.
Usage: `python torch_index.py URL` (an empty URL prints nothing).
"""

import socket
import sys
from typing import Final
from urllib.parse import urlsplit

PROBE_TIMEOUT_S: Final = 3.0


def reachable(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the URL's host and port opens within ``timeout_s``."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout=timeout_s):
            return True
    except OSError:
        return False


def main(argv: list[str]) -> None:
    """Print ``--extra-index-url URL`` when URL answers; say on stderr when it does not."""
    url = argv[0] if argv else ""
    if not url:
        return
    if reachable(url):
        print(f"--extra-index-url {url}")
        print(f"torch: CPU wheels from {url}", file=sys.stderr)
    else:
        print(
            f"torch: {url} unreachable within {PROBE_TIMEOUT_S:.0f} s; pip uses its own "
            "index (on Linux PyPI's torch is the CUDA build: gigabytes). "
            "TORCH_INDEX_URL= skips this probe.",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
