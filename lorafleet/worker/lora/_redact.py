"""Re-export of :func:`proto.uris.redact_uri`, which the frontend needs too."""

from lorafleet.proto.uris import redact_uri

__all__ = ["redact_uri"]
