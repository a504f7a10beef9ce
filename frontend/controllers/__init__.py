"""HTTP controllers of the frontend, one per resource."""

from typing import Final

from frontend.controllers.adapters import AdaptersController
from frontend.controllers.chat import ChatCompletionsController
from frontend.controllers.completions import CompletionsController
from frontend.controllers.models import ModelsController
from frontend.controllers.system import SystemController
from frontend.controllers.vllm_lora import VllmLoraController

__all__ = [
    "AdaptersController",
    "CONTROLLERS",
    "ChatCompletionsController",
    "CompletionsController",
    "ModelsController",
    "SystemController",
    "VllmLoraController",
]

CONTROLLERS: Final = (
    AdaptersController, ChatCompletionsController, CompletionsController, ModelsController,
    SystemController, VllmLoraController,
)  # fmt: skip
"""Every controller, as the app mounts them."""
