"""The LoRA manager: resolve adapter URIs (file://, s3://, hf://, custom) to local directories."""

from worker.lora._redact import redact_uri
from worker.lora.config import LoRAManagerConfig
from worker.lora.errors import (
    LoraConfigError,
    LoraInvalidAdapterError,
    LoraInvalidUriError,
    LoraNotFoundError,
    LoraSourceError,
    LoraUnavailableError,
)
from worker.lora.hf_source import HfSource
from worker.lora.lora_manager import DownloadResult, LoRAManager
from worker.lora.source import InPlaceSource, LoRASource

__all__ = [
    "DownloadResult",
    "HfSource",
    "InPlaceSource",
    "LoRAManager",
    "LoRAManagerConfig",
    "LoRASource",
    "LoraConfigError",
    "LoraInvalidAdapterError",
    "LoraInvalidUriError",
    "LoraNotFoundError",
    "LoraSourceError",
    "LoraUnavailableError",
    "redact_uri",
]
