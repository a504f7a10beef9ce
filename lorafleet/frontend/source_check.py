"""Refuse at once, before anything is declared, an adapter source that cannot load anywhere.

vLLM's load on the frontend answers as vLLM does, so statically wrong input gets
a 4xx before any worker is asked: a URI without a scheme, an ``http(s)://``
URL (no adapter source downloads one), and a ``file://`` path that this
frontend can see but that is no adapter directory (``/etc``, a file) or whose
rank exceeds every instance's ``max_lora_rank``. A path the frontend cannot see
may exist on the workers' disks: they say whether it does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from lorafleet.fleet.adapter_files import adapter_problem, check_adapter_rank
from lorafleet.proto.errors import InvalidRequestError
from lorafleet.proto.uris import public_uri, split_uri

__all__ = ["check_source"]

URL_SCHEMES: Final = frozenset({"http", "https"})


def check_source(name: str, uri: str, *, max_rank: int) -> None:
    """Raise ``InvalidRequestError`` naming the problem when ``uri`` cannot be adapter
    ``name``'s source; ``max_rank`` is the largest rank limit of the instances (0: unknown)."""
    parts = split_uri(uri)
    if parts is None:
        raise InvalidRequestError(
            f"lora_path of adapter {name!r} is not a URI with a scheme; use an absolute "
            "path, file://, s3:// or hf://"
        )
    scheme, rest = parts
    if scheme in URL_SCHEMES:
        raise InvalidRequestError(
            f"lora_path {public_uri(uri)} of adapter {name!r} is a web URL; no adapter source "
            "downloads one: use an absolute path, file://, s3:// or hf://"
        )
    if scheme != "file":
        return
    path = Path(rest)
    if not path.exists():
        return  # not on this frontend's disk: the workers' may have it, and they say so
    problem = adapter_problem(path)
    if problem is not None:
        raise InvalidRequestError(
            f"lora_path {public_uri(uri)} of adapter {name!r} is no LoRA adapter: {problem}"
        )
    if max_rank > 0:
        try:
            check_adapter_rank(name, path, max_rank)
        except InvalidRequestError as exc:
            message = exc.message.replace(str(path), public_uri(uri))
            raise InvalidRequestError(message.replace("this engine", "its instances")) from None
