"""The frontend process: OpenAI API, model registry from etcd, router, NATS client."""

from frontend.app import create_app
from frontend.config import FrontendConfig
from frontend.desired_state import DesiredState
from frontend.dispatcher import Dispatcher, DispatchSettings
from frontend.errors import HTTP_STATUS_BY_CODE, http_status
from frontend.on_demand import OnDemandLoader
from frontend.registry import ModelRegistry, ServedModel
from frontend.request_plane import RequestPlane
from frontend.resolver import ModelResolver
from frontend.router import ROUTERS, LeastInflightRouter, RoundRobinRouter, Router

__all__ = [
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
