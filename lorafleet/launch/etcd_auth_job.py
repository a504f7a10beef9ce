"""The compose stack's one-shot ``etcd-auth`` service: turn on etcd auth once, from the environment.

It runs the grants of ``lorafleet/launch/etcd_auth.py`` (the ones ``lorafleet up --secure`` makes),
so compose and the local cluster cannot drift apart. Run again on an etcd whose auth is
already on (asked as root), it changes nothing and succeeds: ``docker compose up`` runs it
every time. A root password that etcd does not know is one line and exit 1.

    ETCD_ENDPOINTS=http://etcd:2379 ETCD_ROOT_PASSWORD=... ETCD_AUTH_USERNAME=lorafleet \\
        ETCD_AUTH_PASSWORD=... python -m lorafleet.launch.etcd_auth_job
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Final

from lorafleet.launch.etcd_auth import EtcdUser, auth_enabled, enable_etcd_auth

__all__ = ["REQUIRED_VARIABLES", "main"]

REQUIRED_VARIABLES: Final = (
    "ETCD_ENDPOINTS",
    "ETCD_ROOT_PASSWORD",
    "ETCD_AUTH_USERNAME",
    "ETCD_AUTH_PASSWORD",
)


def main(env: Mapping[str, str] = os.environ) -> int:
    """Enable auth on ``ETCD_ENDPOINTS`` unless it is on; 0 on success, 1 with one line."""
    missing = [name for name in REQUIRED_VARIABLES if not env.get(name)]
    if missing:
        print(f"etcd-auth: set {', '.join(missing)}", file=sys.stderr)
        return 1
    endpoints = env["ETCD_ENDPOINTS"]
    try:
        if auth_enabled(endpoints, root_password=env["ETCD_ROOT_PASSWORD"]):
            print(f"etcd-auth: authentication is already on at {endpoints}; nothing to do")
            return 0
        user = EtcdUser(username=env["ETCD_AUTH_USERNAME"], password=env["ETCD_AUTH_PASSWORD"])
        enable_etcd_auth(endpoints, root_password=env["ETCD_ROOT_PASSWORD"], user=user)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        hint = "check ETCD_ROOT_PASSWORD: etcd keeps the users of its first run in its data"
        print(f"etcd-auth: {exc}; {hint}", file=sys.stderr)
        return 1
    print(f"etcd-auth: root and {user.username} (readwrite on {user.prefix}) added, auth on")
    return 0


if __name__ == "__main__":
    sys.exit(main())
