"""Every message that crosses a process boundary, as msgspec Structs; no I/O."""

from proto.adapters import (
    AdapterSpec,
    LoadLoraRequest,
    LoraListResponse,
    LoraResponse,
    LoraSource,
    UnloadLoraRequest,
    validate_lora_name,
)
from proto.discovery import Instance, LoraInfo, ModelDeploymentCard, RuntimeConfig
from proto.errors import (
    CapacityError,
    ConflictError,
    ErrorInfo,
    InvalidRequestError,
    LorafleetError,
    NotFoundError,
    UnauthorizedError,
    UnavailableError,
    UpstreamError,
)
from proto.inference import (
    ChatMessage,
    ErrorChunk,
    FinalChunk,
    GenerateRequest,
    SamplingParams,
    TokenChunk,
    Usage,
)
from proto.naming import lora_id, lora_slug

__all__ = [
    "AdapterSpec",
    "CapacityError",
    "ChatMessage",
    "ConflictError",
    "ErrorChunk",
    "ErrorInfo",
    "FinalChunk",
    "GenerateRequest",
    "Instance",
    "InvalidRequestError",
    "LoadLoraRequest",
    "LoraInfo",
    "LoraListResponse",
    "LoraResponse",
    "LoraSource",
    "LorafleetError",
    "ModelDeploymentCard",
    "NotFoundError",
    "RuntimeConfig",
    "SamplingParams",
    "TokenChunk",
    "UnauthorizedError",
    "UnavailableError",
    "UnloadLoraRequest",
    "UpstreamError",
    "Usage",
    "lora_id",
    "lora_slug",
    "validate_lora_name",
]
