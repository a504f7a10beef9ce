"""``python -m bench.etcd_recovery``: how fast leases and watches come back after etcd faults.

``outage``: one etcd is SIGKILLed for ``--outage-s``, then started again on its data.
From etcd's return (``/health`` true) it times the first successful keep-alive of a
``LeaseKeeper`` and the moment a ``WatchCache`` holds a key written right after.

``leader-kill``: three members; a frontend and two mocker workers whose
``ETCD_ENDPOINTS`` list the leader first; closed-loop non-streaming chats through the
frontend. Each round SIGKILLs the leader and times until another member is leader and
until a keep-alive probe over the same endpoint list succeeds; requests are counted,
and the workers' records (keys and leases) are compared before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from bench._cluster import BenchCluster
from bench._load import Outcome, Session, closed_loop
from bench._report import add_output_flags, benchmark_main, machine, table
from bench.serve import http_session
from lorafleet.discovery.client import EtcdClient, connect_etcd
from lorafleet.discovery.lease import LeaseKeeper, LeaseState
from lorafleet.discovery.watch_cache import WatchCache
from lorafleet.launch.etcd_cluster import EtcdCluster
from lorafleet.launch.local_servers import start_etcd

__all__ = ["build_parser", "main", "run"]

POLL_S: Final = 0.005
PROBE_INTERVAL_S: Final = 0.01
SETTLE_S: Final = 2.0
"""Load runs this long before each kill and after the new leader is elected."""


async def _until(condition: Any, timeout_s: float = 60.0) -> float:
    """Poll ``condition()`` until true; returns that moment (perf_counter)."""
    deadline = time.perf_counter() + timeout_s
    while not condition():
        if time.perf_counter() > deadline:
            raise TimeoutError("condition never held")
        await asyncio.sleep(POLL_S)
    return time.perf_counter()


async def outage_round(outage_s: float, lease_ttl_s: int) -> dict[str, Any]:
    """One SIGKILL of a lone etcd for ``outage_s``; times the recovery after its return."""
    server = start_etcd(Path(tempfile.mkdtemp(prefix="lorafleet-bench-etcd-")))
    etcd = await connect_etcd(server.url)
    keeper = await LeaseKeeper.grant(etcd, lease_ttl_s)
    await keeper.put("bench/owned", b"1")
    cache = await WatchCache.start(etcd, "bench/", bytes)
    try:
        server.stop(kill=True)
        await asyncio.sleep(outage_s)
        await asyncio.to_thread(server.start_again)
        back = time.perf_counter()
        writer = await connect_etcd(server.url)
        await writer.put(b"bench/after", b"1")
        await writer.close()
        watched = await _until(lambda: "bench/after" in cache.items)
        kept = await _until(lambda: keeper.state is LeaseState.ACTIVE)
        owned = await etcd.get(b"bench/owned")
        survived = owned is not None and owned.lease == keeper.lease_id
    finally:
        await cache.aclose()
        await keeper.aclose()
        await etcd.close()
        server.stop()
    return {"outage_s": outage_s, "keepalive_resumed_s": kept - back,
            "watch_caught_up_s": watched - back, "lease_survived": survived}  # fmt: skip


class _Traffic:
    """Closed-loop chats counted while ``running``."""

    def __init__(self) -> None:
        self.sent = 0
        self.failed = 0
        self.running = True

    async def loop(self, session: Session) -> None:
        """One closed-loop client until ``running`` turns false."""
        await closed_loop(session, lambda: self.running, self._count)

    def _count(self, outcome: Outcome, started: float, ended: float) -> None:
        self.sent += 1
        self.failed += not outcome.ok


class _KeepAliveProbe:
    """A keep-alive every 10 ms over the workers' endpoint list; remembers successes."""

    def __init__(self, etcd: EtcdClient, lease_id: int) -> None:
        self.etcd = etcd
        self.lease_id = lease_id
        self.last_ok = 0.0

    async def loop(self) -> None:
        while True:
            try:
                with self.etcd.errors("probe keep-alive"):
                    await self.etcd.keep_lease_alive(self.lease_id)
                self.last_ok = time.perf_counter()
            except Exception:  # etcd failing over: keep probing
                pass
            await asyncio.sleep(PROBE_INTERVAL_S)


async def _records(etcd: EtcdClient, prefix: str) -> dict[str, int]:
    return {kv.key.decode(): kv.lease for kv in await etcd.get_prefix(prefix.encode())}


async def _kill_leader(etcd_cluster: EtcdCluster, probe: _KeepAliveProbe) -> dict[str, float]:
    leader = await asyncio.to_thread(etcd_cluster.wait_for_leader)
    killed = time.perf_counter()
    leader.stop(kill=True)
    await asyncio.to_thread(etcd_cluster.wait_for_leader, 60.0)
    elected = time.perf_counter()
    resumed = await _until(lambda: probe.last_ok > killed)
    await asyncio.sleep(SETTLE_S)
    await asyncio.to_thread(leader.start_again)
    return {"leader_elected_s": elected - killed, "keepalive_resumed_s": resumed - killed}


async def leader_kill(rounds: int, lease_ttl_s: int, concurrency: int) -> dict[str, Any]:
    """``rounds`` leader kills under chat load through a frontend to two mocker workers."""
    with BenchCluster(lease_ttl_s=lease_ttl_s, etcd_members=3) as cluster:
        assert cluster.etcd_cluster is not None
        leader = cluster.etcd_cluster.wait_for_leader()
        cluster.etcd_cluster.members.sort(key=lambda member: member is not leader)
        frontend = cluster.frontend()
        workers = [cluster.worker() for _ in range(2)]
        etcd = await connect_etcd(cluster.etcd_endpoints)
        probe = _KeepAliveProbe(etcd, (await etcd.lease(lease_ttl_s)).id)
        before = await _records(etcd, "v1/")
        traffic = _Traffic()
        session = http_session(frontend.port, stream=False)
        tasks = [asyncio.create_task(traffic.loop(session)) for _ in range(concurrency)]
        probing = asyncio.create_task(probe.loop())
        await asyncio.sleep(SETTLE_S)
        kills = [await _kill_leader(cluster.etcd_cluster, probe) for _ in range(rounds)]
        traffic.running = False
        await asyncio.gather(*tasks)
        probing.cancel()
        after = await _records(etcd, "v1/")
        await etcd.close()
        failures = sum(w.log_text().count("keep-alive failed") for w in workers)
    return {"kills": kills, "requests": traffic.sent, "failed": traffic.failed,
            "records_unchanged": before == after, "records": len(before),
            "worker_keepalive_failures": failures}  # fmt: skip


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the chosen scenarios and return their figures."""
    results: dict[str, Any] = {"bench": "etcd_recovery", "machine": machine()}
    if args.mode in ("outage", "both"):
        results["outage"] = [
            await outage_round(args.outage_s, args.lease_ttl_s) for _ in range(args.rounds)
        ]
    if args.mode in ("leader-kill", "both"):
        results["leader_kill"] = await leader_kill(args.rounds, args.lease_ttl_s, args.concurrency)
    return results


def _text(results: dict[str, Any]) -> str:
    parts = []
    if "outage" in results:
        rows = [[r["outage_s"], r["keepalive_resumed_s"], r["watch_caught_up_s"],
                 r["lease_survived"]] for r in results["outage"]]  # fmt: skip
        parts.append(table(["outage s", "keep-alive s", "watch s", "lease kept"], rows))
    if "leader_kill" in results:
        lk = results["leader_kill"]
        rows = [[i + 1, k["leader_elected_s"], k["keepalive_resumed_s"]]
                for i, k in enumerate(lk["kills"])]  # fmt: skip
        parts.append(table(["kill", "leader elected s", "keep-alive s"], rows))
        parts.append(f"requests {lk['requests']}, failed {lk['failed']}, records unchanged "
                     f"{lk['records_unchanged']} ({lk['records']}), worker keep-alive "
                     f"failures {lk['worker_keepalive_failures']}")  # fmt: skip
    return "\n\n".join(parts)


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags."""
    parser = argparse.ArgumentParser(prog="python -m bench.etcd_recovery", description=__doc__)
    parser.add_argument("--mode", choices=["outage", "leader-kill", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--outage-s", type=float, default=30.0)
    parser.add_argument("--lease-ttl-s", type=int, default=10, help="leases' TTL")
    parser.add_argument("--concurrency", type=int, default=8, help="chat clients (leader-kill)")
    add_output_flags(parser)
    return parser


main: Final = benchmark_main(build_parser, run, lambda results, _: _text(results))


if __name__ == "__main__":
    sys.exit(main())
