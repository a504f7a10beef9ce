"""Where ``lorafleet up``'s workers may read ``file://`` adapters: the demo and cache folders.

A laptop's open demo must not let whoever reaches it choose what its worker reads
from disk: unless ``DYN_LORA_FILE_ROOTS`` is set (then it is used as given), workers
read only the demo model's folder, the adapter cache and the adapters ``up`` itself
was told to load.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from lorafleet.launch.demo_model import default_root
from lorafleet.proto.uris import split_uri
from lorafleet.worker.lora.config import LoRAManagerConfig

__all__ = ["file_roots_env"]


def file_roots_env(
    adapters: Mapping[str, str], environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """``{"DYN_LORA_FILE_ROOTS": ...}`` for the workers, or nothing when the user set it."""
    env = os.environ if environ is None else environ
    if env.get("DYN_LORA_FILE_ROOTS", "").strip():
        return {}
    roots = [default_root().resolve(), LoRAManagerConfig.from_env(env).cache_dir.resolve()]
    for uri in adapters.values():
        parts = split_uri(uri)
        if parts is not None and parts[0] == "file":
            roots.append(Path(parts[1]).resolve())
    return {"DYN_LORA_FILE_ROOTS": os.pathsep.join(dict.fromkeys(map(str, roots)))}
