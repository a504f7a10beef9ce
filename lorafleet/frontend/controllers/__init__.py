"""HTTP controllers of the frontend, one per resource."""

from typing import Final

from lorafleet.frontend.controllers.adapters import AdaptersController
from lorafleet.frontend.controllers.aliases import AliasesController, RolloutsController
from lorafleet.frontend.controllers.chat import ChatCompletionsController
from lorafleet.frontend.controllers.completions import CompletionsController
from lorafleet.frontend.controllers.models import ModelsController
from lorafleet.frontend.controllers.system import SystemController
from lorafleet.frontend.controllers.tenants import KeysController, TenantsController
from lorafleet.frontend.controllers.vllm_lora import VllmLoraController

__all__ = [
    "AdaptersController",
    "AliasesController",
    "CONTROLLERS",
    "ChatCompletionsController",
    "CompletionsController",
    "KeysController",
    "ModelsController",
    "RolloutsController",
    "SystemController",
    "TenantsController",
    "VllmLoraController",
]

CONTROLLERS: Final = (
    AdaptersController, ChatCompletionsController, CompletionsController, ModelsController,
    SystemController, VllmLoraController, AliasesController, RolloutsController,
    TenantsController, KeysController,
)  # fmt: skip
"""Every controller, as the app mounts them."""
