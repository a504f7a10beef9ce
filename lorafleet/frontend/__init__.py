"""The frontend process: OpenAI API, model registry from etcd, router, NATS client."""

from lorafleet.frontend.admission import AdmissionSettings
from lorafleet.frontend.app import create_app
from lorafleet.frontend.config import FrontendConfig
from lorafleet.frontend.desired_state import DesiredState
from lorafleet.frontend.dispatcher import Dispatcher, DispatchSettings
from lorafleet.frontend.errors import HTTP_STATUS_BY_CODE, http_status
from lorafleet.frontend.on_demand import OnDemandLoader
from lorafleet.frontend.registry import ModelRegistry, ServedModel
from lorafleet.frontend.request_plane import RequestPlane
from lorafleet.frontend.resolver import ModelResolver
from lorafleet.frontend.router import ROUTERS, LeastInflightRouter, RoundRobinRouter, Router

__all__ = [
    "AdmissionSettings",
    "DesiredState",
    "DispatchSettings",
    "Dispatcher",
    "FrontendConfig",
    "HTTP_STATUS_BY_CODE",
    "LeastInflightRouter",
    "ModelRegistry",
    "ModelResolver",
    "OnDemandLoader",
    "ROUTERS",
    "RequestPlane",
    "RoundRobinRouter",
    "Router",
    "ServedModel",
    "create_app",
    "http_status",
]
