"""The LoRA manager: resolve adapter URIs (file://, s3://, hf://, custom) to local directories."""

from lorafleet.worker.lora._redact import redact_uri
from lorafleet.worker.lora.config import LoRAManagerConfig
from lorafleet.worker.lora.errors import (
    LoraConfigError,
    LoraInvalidAdapterError,
    LoraInvalidUriError,
    LoraNotFoundError,
    LoraSourceError,
    LoraTooLargeError,
    LoraUnavailableError,
)
from lorafleet.worker.lora.hf_source import HfSource
from lorafleet.worker.lora.lora_manager import DownloadResult, LoRAManager
from lorafleet.worker.lora.source import InPlaceSource, LoRASource

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
    "LoraTooLargeError",
    "LoraUnavailableError",
    "redact_uri",
]
