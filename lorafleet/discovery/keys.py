"""The etcd key layout, built in one place (see docs/architecture.md, "etcd key layout").

Edit only together with the design: frontends and workers of different
versions must agree on these keys.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ADAPTERS_ROOT",
    "ALIASES_ROOT",
    "API_KEYS_ROOT",
    "DEFAULT_NAMESPACE",
    "FRONTENDS_ROOT",
    "INSTANCES_ROOT",
    "KEYS_ROOT",
    "LOAD_ROOT",
    "MDC_ROOT",
    "ROLLOUTS_ROOT",
    "SLO_ROOT",
    "TENANTS_ROOT",
    "adapter_key",
    "adapters_prefix",
    "alias_key",
    "aliases_prefix",
    "api_key_key",
    "api_keys_prefix",
    "base_card_key",
    "card_prefix",
    "endpoint_path",
    "frontend_key",
    "frontends_prefix",
    "instance_key",
    "instance_prefix",
    "load_key",
    "load_prefix",
    "lora_card_key",
    "nats_subject",
    "parse_card_key",
    "parse_load_key",
    "rollout_report_key",
    "rollout_reports_prefix",
    "slo_copies_key",
    "slo_copies_prefix",
    "slo_report_key",
    "slo_reports_prefix",
    "tenant_key",
    "tenants_prefix",
]

DEFAULT_NAMESPACE: Final = "lorafleet"
"""``DYN_NAMESPACE`` when unset: the first segment of every key and subject."""
KEYS_ROOT: Final = "v1/"
"""Every key lorafleet writes starts with this: the prefix an etcd role must reach."""
INSTANCES_ROOT: Final = "v1/instances/"
MDC_ROOT: Final = "v1/mdc/"
ADAPTERS_ROOT: Final = "v1/adapters/"
LOAD_ROOT: Final = "v1/load/"
ALIASES_ROOT: Final = "v1/aliases/"
ROLLOUTS_ROOT: Final = "v1/rollouts/"
TENANTS_ROOT: Final = "v1/tenants/"
API_KEYS_ROOT: Final = "v1/keys/"
FRONTENDS_ROOT: Final = "v1/frontends/"
SLO_ROOT: Final = "v1/slo/"


def endpoint_path(namespace: str, component: str, endpoint: str) -> str:
    """A worker endpoint as keys name it: ``namespace/component/endpoint``."""
    return f"{namespace}/{component}/{endpoint}"


def _path(namespace: str, component: str, endpoint: str, instance_id: int) -> str:
    return f"{endpoint_path(namespace, component, endpoint)}/{instance_id:x}"


def instance_key(namespace: str, component: str, endpoint: str, instance_id: int) -> str:
    """Key of a worker endpoint's ``Instance`` record."""
    return INSTANCES_ROOT + _path(namespace, component, endpoint, instance_id)


def instance_prefix(namespace: str) -> str:
    """Prefix of every instance record in a namespace."""
    return f"{INSTANCES_ROOT}{namespace}/"


def base_card_key(namespace: str, component: str, endpoint: str, instance_id: int) -> str:
    """Key of an instance's base-model card."""
    return MDC_ROOT + _path(namespace, component, endpoint, instance_id)


def lora_card_key(
    namespace: str, component: str, endpoint: str, instance_id: int, slug: str
) -> str:
    """Key of an instance's card for the adapter with ``slug``."""
    return f"{base_card_key(namespace, component, endpoint, instance_id)}/{slug}"


def card_prefix(namespace: str) -> str:
    """Prefix of every card in a namespace."""
    return f"{MDC_ROOT}{namespace}/"


def adapters_prefix(namespace: str) -> str:
    """Prefix of the fleet's desired adapter state in a namespace."""
    return f"{ADAPTERS_ROOT}{namespace}/"


def adapter_key(namespace: str, slug: str) -> str:
    """Key of one adapter's desired state (persistent, no lease)."""
    return f"{adapters_prefix(namespace)}{slug}"


def aliases_prefix(namespace: str) -> str:
    """Prefix of the fleet's aliases (desired state) in a namespace."""
    return f"{ALIASES_ROOT}{namespace}/"


def alias_key(namespace: str, slug: str) -> str:
    """Key of one alias: its targets and rollout (persistent, no lease)."""
    return f"{aliases_prefix(namespace)}{slug}"


def rollout_reports_prefix(namespace: str, slug: str) -> str:
    """Prefix of the frontends' window reports of one alias's rollout."""
    return f"{ROLLOUTS_ROOT}{namespace}/{slug}/"


def rollout_report_key(namespace: str, slug: str, frontend_id: str) -> str:
    """Key of one frontend's window report of one alias (under that frontend's lease)."""
    return f"{rollout_reports_prefix(namespace, slug)}{frontend_id}"


def tenants_prefix(namespace: str) -> str:
    """Prefix of the tenants (desired state) in a namespace."""
    return f"{TENANTS_ROOT}{namespace}/"


def tenant_key(namespace: str, name: str) -> str:
    """Key of one tenant: its model patterns and limits (persistent, no lease)."""
    return f"{tenants_prefix(namespace)}{name}"


def api_keys_prefix(namespace: str) -> str:
    """Prefix of the API key records in a namespace."""
    return f"{API_KEYS_ROOT}{namespace}/"


def api_key_key(namespace: str, key_hash: str) -> str:
    """Key of one API key's record, named by the key's sha256 (the key is never stored)."""
    return f"{api_keys_prefix(namespace)}{key_hash}"


def frontends_prefix(namespace: str) -> str:
    """Prefix of the live frontends' presence records in a namespace."""
    return f"{FRONTENDS_ROOT}{namespace}/"


def frontend_key(namespace: str, frontend_id: str) -> str:
    """Key of one frontend's presence record (under that frontend's lease)."""
    return f"{frontends_prefix(namespace)}{frontend_id}"


def slo_reports_prefix(namespace: str) -> str:
    """Prefix of the frontends' latency window reports (``proto.slo.SloReport``)."""
    return f"{SLO_ROOT}{namespace}/reports/"


def slo_report_key(namespace: str, frontend_id: str) -> str:
    """Key of one frontend's last window report (under that frontend's lease)."""
    return f"{slo_reports_prefix(namespace)}{frontend_id}"


def slo_copies_prefix(namespace: str) -> str:
    """Prefix of the copies adapters' latency targets added (``proto.slo.SloCopies``)."""
    return f"{SLO_ROOT}{namespace}/copies/"


def slo_copies_key(namespace: str, slug: str) -> str:
    """Key of one adapter's SLO copies record (persistent, no lease)."""
    return f"{slo_copies_prefix(namespace)}{slug}"


def load_key(namespace: str, component: str, endpoint: str, instance_id: int) -> str:
    """Key of a worker endpoint's ``InstanceLoad`` record (slots, load, failed loads)."""
    return LOAD_ROOT + _path(namespace, component, endpoint, instance_id)


def load_prefix(namespace: str) -> str:
    """Prefix of every load record in a namespace."""
    return f"{LOAD_ROOT}{namespace}/"


def nats_subject(namespace: str, component: str, endpoint: str, instance_id: int) -> str:
    """NATS subject one instance answers on; the frontend picks instances, never NATS."""
    return f"{namespace}.{component}.{endpoint}-{instance_id:x}"


def kv_events_subject(namespace: str) -> str:
    """NATS subject every worker of a namespace publishes its KV block events on and every
    frontend reads (``proto.kv_events``); plain subscriptions, so each frontend sees all."""
    return f"{namespace}.kv_events"


def parse_load_key(key: str) -> tuple[str, int]:
    """Split a load record's key into (``ns/component/endpoint``, instance id).

    Raises ValueError for a key outside the load layout.
    """
    parts = key.removeprefix(LOAD_ROOT).split("/")
    if not key.startswith(LOAD_ROOT) or len(parts) != 4:
        raise ValueError(f"not a load record key: {key!r}")
    return "/".join(parts[:3]), int(parts[3], 16)


def parse_card_key(key: str) -> tuple[str, int, str | None]:
    """Split a card key into (``ns/component/endpoint``, instance id, lora slug or None).

    Raises ValueError for a key outside the card layout.
    """
    parts = key.removeprefix(MDC_ROOT).split("/")
    if not key.startswith(MDC_ROOT) or len(parts) not in (4, 5):
        raise ValueError(f"not a card key: {key!r}")
    return "/".join(parts[:3]), int(parts[3], 16), parts[4] if len(parts) == 5 else None
