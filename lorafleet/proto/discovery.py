"""Records a worker publishes in etcd: its instance and its model deployment cards.

They are stored as indented JSON so that ``etcdctl get --prefix v1/`` stays
readable by a person. New fields always get a default (peers may be older).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from lorafleet.proto.kv_events import KvCacheSpec

__all__ = [
    "Instance",
    "LoraInfo",
    "ModelDeploymentCard",
    "ModelType",
    "RuntimeConfig",
    "decode_card",
    "decode_instance",
    "encode_record",
]

ModelType = Literal["chat", "completions"]


class Instance(msgspec.Struct, kw_only=True, frozen=True):
    """One worker endpoint: where to send requests and where to manage it."""

    namespace: str
    component: str
    endpoint: str
    instance_id: int
    subject: str
    system_url: str = ""
    engine: str = ""
    host: str = ""
    pid: int = 0
    started_at: float = 0.0
    kv_cache: KvCacheSpec | None = None
    """The engine's prefix cache, for prefix-aware routers; None: it keeps none (or the
    worker predates prefix routing)."""


class RuntimeConfig(msgspec.Struct, kw_only=True, frozen=True):
    """Engine limits a router or operator may want to know about."""

    max_loras: int = 0
    max_lora_rank: int = 0
    enable_lora: bool = False


class LoraInfo(msgspec.Struct, kw_only=True, frozen=True):
    """What makes a card an adapter's card: which adapter, on which base, from where."""

    name: str
    lora_id: int
    base_model: str
    uri: str = ""
    local_path: str = ""
    digest: str = ""
    """The content digest of the weights the engine holds (``sha256:<hex>``,
    ``worker.lora.digest``); empty from a worker that predates versions."""
    warnings: list[str] = msgspec.field(default_factory=list)
    """What the worker let through when it loaded these weights (e.g. trained for another
    base model, under ``DYN_LORA_BASE_MODEL_CHECK=warn``); ``/v1/adapters`` shows them."""


class ModelDeploymentCard(msgspec.Struct, kw_only=True, frozen=True):
    """A model a worker serves: the base model (``lora`` is None) or one adapter."""

    display_name: str
    slug: str
    source_path: str = ""
    model_type: list[ModelType] = msgspec.field(default_factory=lambda: ["chat", "completions"])
    context_length: int = 0
    runtime_config: RuntimeConfig = msgspec.field(default_factory=RuntimeConfig)
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    lora: LoraInfo | None = None
    created: int = 0

    @property
    def parent(self) -> str | None:
        """The base model an adapter card hangs off; None for a base card."""
        return self.lora.base_model if self.lora else None


_encoder = msgspec.json.Encoder()
_card_decoder = msgspec.json.Decoder(ModelDeploymentCard)
_instance_decoder = msgspec.json.Decoder(Instance)


def encode_record(record: Instance | ModelDeploymentCard) -> bytes:
    """Encode a record as indented JSON, readable through ``etcdctl``."""
    return msgspec.json.format(_encoder.encode(record), indent=2)


def decode_card(data: bytes) -> ModelDeploymentCard:
    """Decode a card; raises ``msgspec.ValidationError``/``DecodeError`` on bad input."""
    return _card_decoder.decode(data)


def decode_instance(data: bytes) -> Instance:
    """Decode an instance record; raises ``msgspec`` errors on bad input."""
    return _instance_decoder.decode(data)
