"""What a private dockerd adds to the host's network, and taking exactly that away again.

dockerd creates a `docker0` bridge, one `br-*` bridge per compose network and iptables
chains and rules, and leaves them when it stops. `make test-compose` snapshots the
bridges and rules before it starts its engine and, once the engine has stopped, deletes
what is new. Must not touch what was there before (another engine's, the host's).
"""

import shlex
import shutil
import subprocess
from dataclasses import dataclass
from typing import Final

TABLES: Final = ("filter", "nat", "mangle", "raw")


@dataclass(frozen=True)
class NetworkSnapshot:
    """The bridges and the iptables chains and rules of the host at one moment."""

    bridges: frozenset[str]
    chains: dict[str, frozenset[str]]
    rules: dict[str, tuple[str, ...]]


def snapshot() -> NetworkSnapshot:
    """Read the host's bridges and its iptables chains and rules per table."""
    chains, rules = {}, {}
    for table in TABLES if shutil.which("iptables-save") else ():
        lines = _run("iptables-save", "-t", table).splitlines()
        chains[table] = frozenset(line[1:].split()[0] for line in lines if line.startswith(":"))
        rules[table] = tuple(line for line in lines if line.startswith("-A "))
    links = _run("ip", "-o", "link", "show", "type", "bridge").splitlines()
    bridges = frozenset(line.split(":")[1].strip().split("@")[0] for line in links if ":" in line)
    return NetworkSnapshot(bridges=bridges, chains=chains, rules=rules)


def remove_added(before: NetworkSnapshot) -> list[str]:
    """Delete the rules, chains and bridges added since `before`; return what was removed."""
    after, removed = snapshot(), []
    for table, rules in after.rules.items():
        for rule in reversed([r for r in rules if r not in before.rules.get(table, ())]):
            _run("iptables", "-t", table, "-D", *shlex.split(rule)[1:], check=False)
            removed.append(f"iptables -t {table} {rule}")
        for chain in sorted(after.chains[table] - before.chains.get(table, frozenset())):
            _run("iptables", "-t", table, "-F", chain, check=False)
            _run("iptables", "-t", table, "-X", chain, check=False)
            removed.append(f"iptables -t {table} chain {chain}")
    for bridge in sorted(after.bridges - before.bridges):
        _run("ip", "link", "delete", bridge, check=False)
        removed.append(f"bridge {bridge}")
    return removed


def _run(*command: str, check: bool = True) -> str:
    result = subprocess.run(command, capture_output=True, text=True, check=check)
    return result.stdout
