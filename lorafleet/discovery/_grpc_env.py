"""Quiet gRPC's own logging before gRPC is imported: only errors reach stderr.

gRPC's core logs a failed TLS handshake as an INFO line of its own on stderr, beside our
one clear ``EtcdRefusedError`` line, and not as JSON under ``LOG_FORMAT=json``. It reads
``GRPC_VERBOSITY`` once, when it is imported; an operator's own setting wins.
"""

from __future__ import annotations

import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
