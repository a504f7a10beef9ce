"""The frontend process: OpenAI API, model registry from etcd, router, NATS client."""

from frontend.app import create_app
from frontend.config import FrontendConfig
from frontend.dispatcher import Dispatcher, DispatchSettings
from frontend.errors import HTTP_STATUS_BY_CODE, http_status
from frontend.registry import ModelRegistry, ServedModel
from frontend.request_plane import RequestPlane, connect_nats
from frontend.router import ROUTERS, LeastInflightRouter, RoundRobinRouter, Router

__all__ = [
    "DispatchSettings",
    "Dispatcher",
    "FrontendConfig",
    "HTTP_STATUS_BY_CODE",
    "LeastInflightRouter",
    "ModelRegistry",
    "ROUTERS",
    "RequestPlane",
    "RoundRobinRouter",
    "Router",
    "ServedModel",
    "connect_nats",
    "create_app",
    "http_status",
]
