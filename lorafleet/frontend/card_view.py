"""What a frontend keeps of a model deployment card: the fields it reads, values shared.

A frontend holds every card of its namespace (10,000 and more), so each byte
kept per card counts: the whole decoded ``ModelDeploymentCard`` (two nested
structs, a list and eight strings) was about 930 bytes of a card's 3 KiB.
``CardView`` keeps only what ``/v1/models``, routing, on-demand loading and
errors read, shares the values that repeat across cards (the base model's
name, the model types, the context length, the rank limit), and is not tracked by the
garbage collector (it holds only strings, numbers and a tuple of strings).
The card in etcd is unchanged: it is decoded and validated as the contract
says (``proto.discovery.decode_card``), then viewed.
"""

from __future__ import annotations

from typing import Final, TypeVar

import msgspec

from lorafleet.proto.discovery import ModelDeploymentCard, decode_card
from lorafleet.proto.uris import public_uri

__all__ = ["CardView", "decode_card_view"]

_V = TypeVar("_V", str, int, tuple[str, ...])
_SHARED: Final[dict[object, object]] = {}
"""One object per value of the fields that repeat across cards (base model names, model
types, context lengths): a few entries per base model, however many cards name them.
(No bools here: ``True == 1`` would share one for the other.)"""


def _shared(value: _V) -> _V:
    return _SHARED.setdefault(value, value)  # type: ignore[return-value]


class CardView(msgspec.Struct, frozen=True, gc=False):
    """The fields of a card a frontend reads."""

    name: str
    """The served model name (the card's ``display_name``)."""
    parent: str | None
    """The base model an adapter card hangs off; None for a base card."""
    source: str
    """Where the weights come from as the card says (an adapter's URI or else its path,
    a base model's path or hub id); may hold secrets and paths: shown only as ``root``."""
    model_type: tuple[str, ...]
    context_length: int
    enable_lora: bool
    """Whether the instance loads adapters (the base card's ``runtime_config``)."""
    max_lora_rank: int
    """The highest adapter rank the instance loads (the base card's ``runtime_config``; 0:
    not said)."""
    created: int
    digest: str = ""
    """An adapter's content digest as its card says (``sha256:<hex>``); "" for a base card."""
    warnings: tuple[str, ...] = ()
    """What the worker let through when it loaded the adapter (``LoraInfo.warnings``)."""

    @classmethod
    def of(cls, card: ModelDeploymentCard) -> CardView:
        """The view of ``card``."""
        lora = card.lora
        return cls(
            name=card.display_name,
            parent=None if lora is None else _shared(lora.base_model),
            source=card.source_path if lora is None else (lora.uri or lora.local_path),
            model_type=_shared(tuple(card.model_type)),
            context_length=_shared(card.context_length),
            enable_lora=card.runtime_config.enable_lora,
            max_lora_rank=_shared(card.runtime_config.max_lora_rank),
            created=card.created,
            digest="" if lora is None else lora.digest,
            warnings=() if lora is None else tuple(lora.warnings),
        )

    @property
    def root(self) -> str:
        """Where the weights come from, as anyone may see it: no secrets, no paths on a
        worker's disk (``public_uri``); the name when the card says nothing."""
        return public_uri(self.source or self.name)


def decode_card_view(data: bytes) -> CardView:
    """Decode a card (raises as ``decode_card`` does) and keep its view."""
    return CardView.of(decode_card(data))
