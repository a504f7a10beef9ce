"""The LoRA manager: resolve adapter URIs (file://, s3://, custom) to local adapter directories."""

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
from worker.lora.lora_manager import LoRAManager
from worker.lora.source import InPlaceSource, LoRASource

__all__ = [
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
