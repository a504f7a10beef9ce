"""Whether an alias or a rollout may be stored, against what the fleet serves and declares.

Each check raises before anything is written, so bad input changes nothing: a target
that is an alias (a cycle), that exists nowhere, or that serves another base model;
an alias named like a served model or a declared adapter; a canary not declared; an
adapter named like an alias (``/v1/adapters`` and vLLM's load alike).
"""

from __future__ import annotations

from lorafleet.frontend.aliases import AliasBook
from lorafleet.frontend.desired_state import DesiredState
from lorafleet.frontend.registry import ModelRegistry
from lorafleet.proto.adapters import validate_lora_name
from lorafleet.proto.aliases import AliasTarget, RolloutRequest, validate_alias_shape
from lorafleet.proto.errors import ConflictError, InvalidRequestError

__all__ = ["AliasChecks"]


class AliasChecks:
    """Checks alias writes against the registry, the desired state and the other aliases."""

    def __init__(self, registry: ModelRegistry, desired: DesiredState, book: AliasBook) -> None:
        self.registry = registry
        self.desired = desired
        self.book = book

    def check_alias(self, name: str, targets: list[AliasTarget]) -> None:
        """Raise unless alias ``name`` may point at ``targets``."""
        try:
            validate_lora_name(name)
        except InvalidRequestError as exc:
            raise InvalidRequestError(exc.message.replace("lora_name", "alias name", 1)) from None
        validate_alias_shape(name, targets)
        self._check_name_free(name)
        bases = {target.model: self.base_of(name, target.model) for target in targets}
        if len(set(bases.values())) > 1:
            listed = ", ".join(f"{model!r} on {base!r}" for model, base in bases.items())
            raise InvalidRequestError(
                f"targets of alias {name!r} serve different base models ({listed}); "
                "an alias's versions must share one base model"
            )

    def check_adapter_name(self, name: str) -> None:
        """Raise ``ConflictError`` when an adapter would take an alias's name: requests for
        that name reach the alias, never the adapter."""
        if self.book.get(name) is not None:
            raise ConflictError(f"name {name!r} is an alias (/v1/aliases); choose another")

    def check_rollout(self, request: RolloutRequest) -> None:
        """Raise unless ``request``'s canary is declared and shares its baseline's base model."""
        if self.desired.get(request.canary) is None:
            raise InvalidRequestError(
                f"canary {request.canary!r} of alias {request.alias!r} is not declared; "
                "declare it first (POST /v1/adapters or lorafleet lora apply)"
            )
        if request.canary == request.baseline:
            raise InvalidRequestError(f"canary and baseline of {request.alias!r} are the same")

    def _check_name_free(self, name: str) -> None:
        served = self.registry.get(name)
        if served is not None:
            kind = "a base model" if served.parent is None else "an adapter"
            raise ConflictError(f"alias name {name!r} is {kind} the fleet serves; choose another")
        if self.desired.get(name) is not None:
            raise ConflictError(f"alias name {name!r} is a declared adapter; choose another")

    def base_of(self, alias: str, model: str) -> str:
        """The base model ``model`` serves; raises if it is an alias, a base model or unknown."""
        if self.book.get(model) is not None:
            raise InvalidRequestError(
                f"alias {alias!r} points at alias {model!r}; aliases point at adapters only "
                "(no chains, no cycles)"
            )
        spec = self.desired.get(model)
        if spec is not None:
            return spec.base_model
        served = self.registry.get(model)
        if served is None:
            raise InvalidRequestError(
                f"target {model!r} of alias {alias!r} does not exist: no adapter of that name "
                "is declared or served"
            )
        if served.parent is None:
            raise InvalidRequestError(
                f"target {model!r} of alias {alias!r} is a base model; targets are adapters"
            )
        return served.parent
