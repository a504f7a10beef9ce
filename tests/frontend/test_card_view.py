"""What a frontend keeps of a card shows in ``/v1/models``, routing and on-demand loading
as the card itself says it."""

from __future__ import annotations

import pytest

from lorafleet.frontend.card_view import CardView, decode_card_view
from lorafleet.frontend.controllers.models import model_object
from lorafleet.frontend.registry import ServedModel
from lorafleet.proto.discovery import (
    Instance,
    LoraInfo,
    ModelDeploymentCard,
    RuntimeConfig,
    encode_record,
)

INSTANCE = Instance(namespace="n", component="c", endpoint="e", instance_id=1, subject="s",
                    started_at=50.0)  # fmt: skip


def _adapter(uri: str = "", local_path: str = "") -> ModelDeploymentCard:
    lora = LoraInfo(name="pirate", lora_id=7, base_model="demo", uri=uri, local_path=local_path)
    return ModelDeploymentCard(display_name="pirate", slug="pirate_x", source_path="/w/p",
                               context_length=512, lora=lora, created=123)  # fmt: skip


@pytest.mark.parametrize(
    ("card", "root"),
    [
        (_adapter("s3://key:secret@bucket/pirate", "/w/p"), "s3://***@bucket/pirate"),
        (_adapter("", "/cache/adapters/pirate"), "file:///***/pirate"),
        (_adapter(), "pirate"),
        (ModelDeploymentCard(display_name="demo", slug="demo", source_path="org/demo"), "org/demo"),
        (
            ModelDeploymentCard(display_name="demo", slug="demo", source_path="/m/demo"),
            "file:///***/demo",
        ),
        (ModelDeploymentCard(display_name="demo", slug="demo"), "demo"),
    ],
)
def test_models_entry_shows_what_the_card_says(card: ModelDeploymentCard, root: str) -> None:
    view = decode_card_view(encode_record(card))
    entry = model_object(ServedModel(name=view.name, card=view, instances=(INSTANCE,)))
    assert (entry.id, entry.root) == (card.display_name, root)
    assert entry.parent == (card.lora.base_model if card.lora else None)
    assert entry.max_model_len == (card.context_length or None)
    assert entry.created == (card.created or 50)


def test_the_view_keeps_model_types_and_whether_the_instance_loads_adapters() -> None:
    card = ModelDeploymentCard(display_name="demo", slug="demo", model_type=["chat"],
                               runtime_config=RuntimeConfig(enable_lora=True))  # fmt: skip
    view = CardView.of(card)
    assert (view.model_type, view.enable_lora) == (("chat",), True)
    assert CardView.of(ModelDeploymentCard(display_name="x", slug="x")).enable_lora is False


def test_an_adapters_digest_shows_in_its_models_entry_and_a_base_keeps_its_rank_limit() -> None:
    lora = LoraInfo(name="pirate", lora_id=7, base_model="demo", digest="sha256:ab12")
    card = ModelDeploymentCard(display_name="pirate", slug="pirate_x", lora=lora)
    view = decode_card_view(encode_record(card))
    entry = model_object(ServedModel(name="pirate", card=view, instances=(INSTANCE,)))
    assert (view.digest, entry.digest) == ("sha256:ab12", "sha256:ab12")
    base = ModelDeploymentCard(display_name="demo", slug="demo",
                               runtime_config=RuntimeConfig(max_lora_rank=16))  # fmt: skip
    base_view = CardView.of(base)
    assert (base_view.max_lora_rank, base_view.digest) == (16, "")
    base_entry = model_object(ServedModel(name="demo", card=base_view, instances=(INSTANCE,)))
    assert base_entry.digest is None
