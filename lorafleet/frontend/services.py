"""What the frontend's handlers use, started by the app's lifespan: one typed object.

The lifespan builds one ``Services`` and puts it on ``app.state.services``; handlers
receive it as the ``services`` dependency (``services_of``). Add a service here, not
as another attribute of ``app.state``.
"""

from __future__ import annotations

from dataclasses import dataclass

from litestar.datastructures import State

from lorafleet.frontend.adapter_states import AdapterStates
from lorafleet.frontend.admission import FleetAdmission
from lorafleet.frontend.alias_checks import AliasChecks
from lorafleet.frontend.aliases import AliasBook
from lorafleet.frontend.desired_state import DesiredState
from lorafleet.frontend.fleet_loads import FleetLoads
from lorafleet.frontend.generation import GenerationService
from lorafleet.frontend.lora_writes import LoraWrites
from lorafleet.frontend.metrics import FrontendMetrics
from lorafleet.frontend.reachability import Unreachable
from lorafleet.frontend.registry import ModelRegistry
from lorafleet.frontend.request_plane import RequestPlane
from lorafleet.frontend.resolver import ModelResolver
from lorafleet.frontend.tenants import TenantGate

__all__ = ["Services", "services_of"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Services:
    """The running parts of one frontend, shared by every request."""

    plane: RequestPlane
    registry: ModelRegistry
    desired: DesiredState
    loads: FleetLoads
    """The workers' load records: slots, load, demand, failed loads."""
    adapters: AdapterStates
    """Each desired adapter's state (``/v1/adapters``, ``/v1/models``)."""
    resolver: ModelResolver
    writes: LoraWrites
    """vLLM's load and unload over the fleet, answered with their outcome."""
    generation: GenerationService
    metrics: FrontendMetrics
    aliases: AliasBook
    """The fleet's aliases (``v1/aliases/``): read, split, written with a compare-and-swap."""
    alias_checks: AliasChecks
    tenants: TenantGate
    """API keys, tenants and this frontend's share of their limits."""
    admission: FleetAdmission
    """This frontend's share of the fleet's slots: queues and sheds by priority."""
    unreachable: Unreachable
    """Instances lost over NATS, kept out of routing until they answer a ping."""


def services_of(state: State) -> Services:
    """The app's services (the ``services`` dependency); set once its lifespan started."""
    services: Services = state.services
    return services
