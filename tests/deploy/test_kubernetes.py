"""deploy/kubernetes/: both overlays rendered by `kubectl kustomize`, every object checked
against the Kubernetes schemas, and the rules of docs/kubernetes.md checked on the result.

No API server can run here, so nothing is applied: the manifests are rendered and read. What
they run is kept the same as compose.yaml's (images, commands, variables), which
`make test-compose` runs for real.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import kubernetes_validate
import pytest
import yaml

from lorafleet.worker.runtime import CLEANUP_BUDGET_S
from tests.compose.compose_cli import resolved

REPO: Final = Path(__file__).resolve().parents[2]
OVERLAYS: Final = ("dev", "prod")
KUBERNETES_VERSIONS: Final = ("1.30.0", "1.35.0")
"""The oldest release the manifests claim to run on, and a recent one."""
WORKLOADS: Final = ("Deployment", "StatefulSet", "Job")
LONG_RUNNING: Final = ("Deployment", "StatefulSet")
COMPONENT: Final = "app.kubernetes.io/component"
OUTSIDE: Final = "<anyone>"
"""A source outside the namespace that no selector names: what an open port lets in."""
PER_DEPLOYMENT: Final = {
    "ETCD_ENDPOINTS", "NATS_SERVER", "DYN_MODEL", "DYN_SERVED_MODEL_NAME",
    "DYN_ADMIN_TOKEN", "DYN_SYSTEM_AUTH_TOKEN",
}  # fmt: skip
"""Compose variables that the manifests set their own way: the servers' names, the model,
and the tokens (read from a Secret's files, DYN_*_FILE, instead of values)."""
SECRET_VARIABLE: Final = re.compile(r"DYN_\w*TOKEN|\w*PASSWORD")
"""Variables that hold a secret: their values must come from a Secret."""
COMPOSE_WORKER: Final = {"mocker": "worker-mocker", "vllm": "worker-vllm", "hf": "worker"}


@functools.cache
def rendered(overlay: str) -> tuple[dict[str, Any], ...]:
    """The overlay as `kubectl kustomize` renders it (the command `kubectl apply -k` runs)."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is not on PATH: `make test` renders deploy/kubernetes with it"
    path = REPO / "deploy" / "kubernetes" / "overlays" / overlay
    done = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True,
                          check=False, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


@functools.cache
def compose_services() -> dict[str, Any]:
    """compose.yaml's services, every profile on, as Compose resolves them."""
    project = resolved("--profile", "gpu", "--profile", "mocker")
    services: dict[str, Any] = project["services"]
    return services


def named(overlay: str, kind: str, name: str) -> dict[str, Any]:
    """The one object of ``kind`` called ``name``."""
    found = [o for o in rendered(overlay) if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, (overlay, kind, name, len(found))
    return found[0]


def pods(overlay: str, kinds: tuple[str, ...] = WORKLOADS) -> Iterator[dict[str, Any]]:
    """Each workload of ``kinds`` in the overlay."""
    yield from (o for o in rendered(overlay) if o["kind"] in kinds)


def spec_of(workload: dict[str, Any]) -> dict[str, Any]:
    pod_spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return pod_spec


def containers(workload: dict[str, Any], *, init: bool = True) -> list[dict[str, Any]]:
    pod = spec_of(workload)
    return [*(pod.get("initContainers", []) if init else []), *pod["containers"]]


def env_of(container: dict[str, Any]) -> dict[str, str]:
    """The container's plain variables (those from Secrets or fields map to None)."""
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def component(workload: dict[str, Any]) -> str:
    label: str = workload["spec"]["template"]["metadata"]["labels"][COMPONENT]
    return label


def worker_containers(overlay: str) -> list[dict[str, Any]]:
    return [
        c
        for w in pods(overlay, LONG_RUNNING)
        for c in containers(w, init=False)
        if c.get("command") == ["python", "-m", "lorafleet.worker"]
    ]


def quantity(text: str | int) -> float:
    """A Kubernetes quantity (``500m``, ``2``, ``1Gi``) as a number."""
    units = {"m": 1e-3, "": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    number, unit = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(text)).groups()  # type: ignore[union-attr]
    return float(number) * units[unit]


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_passes_the_kubernetes_schema_strictly(overlay: str, version: str) -> None:
    for obj in rendered(overlay):
        # Strict: a misspelt or misplaced field fails instead of being dropped by the server.
        # An unknown kind raises SchemaNotFoundError and fails the test too.
        kubernetes_validate.validate(obj, version, strict=True)


def test_a_misspelt_field_fails_the_schema_check() -> None:
    frontend = named("dev", "Deployment", "frontend")
    broken = yaml.safe_load(yaml.safe_dump(frontend))
    spec_of(broken)["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/health"
    with pytest.raises(kubernetes_validate.ValidationError, match="paht"):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[0], strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_long_running_container_probes_its_health_route(overlay: str) -> None:
    for workload in pods(overlay, LONG_RUNNING):
        for container in containers(workload, init=False):
            ports = {p.get("name"): p["containerPort"] for p in container["ports"]}
            probes = {
                kind: container[f"{kind}Probe"] for kind in ("startup", "readiness", "liveness")
            }
            for kind, probe in probes.items():
                path, port = probe["httpGet"]["path"], probe["httpGet"]["port"]
                where = (workload["metadata"]["name"], kind)
                assert path.split("?")[0] in ("/health", "/healthz"), where
                assert ports.get(port, port) in ports.values(), where
                if container["image"].startswith("lorafleet:"):
                    # The process's own port and /health: 503 while it cannot serve (a worker
                    # cut from NATS, or from etcd with its lease expired; a frontend without
                    # NATS), so readiness takes it out of rotation.
                    env = env_of(container)
                    own = env.get("DYN_HTTP_PORT") or env["DYN_SYSTEM_PORT"]
                    assert path == "/health" and ports[port] == int(own), where
            # Readiness acts within seconds; liveness only restarts a process that stayed
            # unhealthy far longer, as lorafleet's processes reconnect by themselves.
            window = {k: p["periodSeconds"] * p["failureThreshold"] for k, p in probes.items()}
            assert window["liveness"] > 3 * window["readiness"], workload["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_variable_reference_names_a_variable_set_before_it(overlay: str) -> None:
    """The kubelet expands ``$(NAME)`` only from variables listed earlier in ``env``;
    anything else stays literal (etcd would advertise ``https://$(POD_NAME).etcd:2379``)."""
    for workload in pods(overlay):
        for container in containers(workload):
            defined: set[str] = set()
            for variable in container.get("env", []):
                for name in re.findall(r"\$\((\w+)\)", variable.get("value", "")):
                    assert name in defined, (workload["metadata"]["name"], variable["name"], name)
                defined.add(variable["name"])
            for word in container.get("command", []) + container.get("args", []):
                for name in re.findall(r"\$\((\w+)\)", word):
                    assert name in defined, (workload["metadata"]["name"], word)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_has_requests_and_limits(overlay: str) -> None:
    for workload in pods(overlay):
        for container in containers(workload):
            resources = container["resources"]
            for name in ("cpu", "memory"):
                request, limit = resources["requests"][name], resources["limits"][name]
                assert quantity(request) <= quantity(limit), (container["name"], name)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_runs_unprivileged_on_a_read_only_root(overlay: str) -> None:
    namespace = named(overlay, "Namespace", "lorafleet")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for workload in pods(overlay):
        pod = spec_of(workload)["securityContext"]
        where = workload["metadata"]["name"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0, where
        assert pod["seccompProfile"]["type"] == "RuntimeDefault", where
        assert spec_of(workload)["enableServiceLinks"] is False, where
        for container in containers(workload):
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, (where, container["name"])
            assert context["capabilities"]["drop"] == ["ALL"], (where, container["name"])
            assert context["readOnlyRootFilesystem"] is True, (where, container["name"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_grace_period_outlasts_the_drain(overlay: str) -> None:
    """A pod killed before its process finished draining fails the requests it still ran."""
    for workload in pods(overlay, LONG_RUNNING):
        if component(workload) not in ("frontend", "worker"):
            continue
        grace = spec_of(workload)["terminationGracePeriodSeconds"]
        for container in containers(workload, init=False):
            env = env_of(container)
            pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {})
            sleep = float(pre_stop["command"][1]) if pre_stop else 0.0
            drain = float(env["DYN_SHUTDOWN_GRACE"]) + CLEANUP_BUDGET_S
            if component(workload) == "worker":
                drain = max(drain, float(env["DYN_LORA_DRAIN_TIMEOUT_S"]))
            assert grace > sleep + drain, (workload["metadata"]["name"], grace, sleep, drain)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_disruption_budgets_keep_etcd_nats_and_frontends_up(overlay: str) -> None:
    budgets = [o for o in rendered(overlay) if o["kind"] == "PodDisruptionBudget"]
    for name in ("etcd", "nats", "frontend"):
        workload = next(w for w in pods(overlay, LONG_RUNNING) if component(w) == name)
        labels = workload["spec"]["template"]["metadata"]["labels"]
        covering = [b for b in budgets if selects(b["spec"]["selector"], labels)]
        assert [b["spec"].get("maxUnavailable") for b in covering] == [1], name
    etcd = named(overlay, "StatefulSet", "etcd")
    # One member down at a time: a quorum stays when there are three.
    assert etcd["spec"]["replicas"] == {"dev": 1, "prod": 3}[overlay]


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels and matchExpressions) selects ``labels``."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values")
        present = key in labels
        held = {
            "In": present and labels.get(key) in (values or []),
            "NotIn": not present or labels.get(key) not in (values or []),
            "Exists": present,
            "DoesNotExist": not present,
        }
        if not held[operator]:
            return False
    return True


def allowed_sources(overlay: str, target: dict[str, str], port: int) -> set[str]:
    """The components (or ``OUTSIDE``) that the overlay's NetworkPolicies let reach ``port`` of
    a pod labelled ``target``. A pod no policy selects would be open to all: none is."""
    policies = [o["spec"] for o in rendered(overlay) if o["kind"] == "NetworkPolicy"]
    applying = [p for p in policies if selects(p["podSelector"], target)]
    assert applying, f"no NetworkPolicy selects {target}"
    components = [w["spec"]["template"]["metadata"]["labels"] for w in pods(overlay)]
    sources: set[str] = set()
    for policy in applying:
        for rule in policy.get("ingress", []):
            if rule.get("ports") and port not in [p["port"] for p in rule["ports"]]:
                continue
            peers = rule.get("from")
            if not peers:
                sources |= {OUTSIDE, *(labels[COMPONENT] for labels in components)}
                continue
            for peer in peers:
                assert "ipBlock" not in peer, policy
                if "namespaceSelector" in peer:
                    sources.add(f"namespace {peer['namespaceSelector']['matchLabels']}")
                else:
                    matched = (c for c in components if selects(peer["podSelector"], c))
                    sources |= {labels[COMPONENT] for labels in matched}
    return sources


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_frontends_and_workers_reach_etcd_and_nats(overlay: str) -> None:
    policies = [o["spec"] for o in rendered(overlay) if o["kind"] == "NetworkPolicy"]
    assert {"podSelector": {}, "policyTypes": ["Ingress"]} in policies  # deny by default
    etcd_clients = {"frontend", "worker"} | ({"etcd-auth"} if overlay == "prod" else set())
    assert allowed_sources(overlay, {COMPONENT: "etcd"}, 2379) == etcd_clients
    assert allowed_sources(overlay, {COMPONENT: "etcd"}, 2380) == {"etcd"}
    assert allowed_sources(overlay, {COMPONENT: "nats"}, 4222) == {"frontend", "worker"}
    assert allowed_sources(overlay, {COMPONENT: "nats"}, 6222) == {"nats"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_frontends_port_is_open_to_everyone(overlay: str) -> None:
    opened = set()
    for workload in pods(overlay):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        for container in containers(workload, init=False):
            for port in container.get("ports", []):
                if OUTSIDE in allowed_sources(overlay, labels, port["containerPort"]):
                    opened.add((labels[COMPONENT], port["containerPort"]))
    assert opened == {("frontend", 8000)}
    services = [o for o in rendered(overlay) if o["kind"] == "Service"]
    assert all(s["spec"].get("type", "ClusterIP") == "ClusterIP" for s in services)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_stateful_set_has_its_headless_service(overlay: str) -> None:
    """A member's name (etcd-0.etcd) resolves only through the Service its set names."""
    for workload in pods(overlay, ("StatefulSet",)):
        service = named(overlay, "Service", workload["spec"]["serviceName"])["spec"]
        assert service["clusterIP"] == "None", workload["metadata"]["name"]
        assert selects(
            {"matchLabels": service["selector"]}, workload["spec"]["template"]["metadata"]["labels"]
        )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_tokens_come_from_secrets_and_metrics_are_scraped(overlay: str) -> None:
    for workload in pods(overlay):
        annotations = workload["spec"]["template"]["metadata"].get("annotations", {})
        if component(workload) in ("frontend", "worker", "etcd"):
            assert annotations["prometheus.io/scrape"] == "true", workload["metadata"]["name"]
        for container in containers(workload):
            for variable in container.get("env", []):
                if SECRET_VARIABLE.fullmatch(variable["name"]):
                    assert "secretKeyRef" in variable.get("valueFrom", {}), variable["name"]
    frontend = next(w for w in pods(overlay) if component(w) == "frontend")
    secrets = [v["secret"]["secretName"] for v in spec_of(frontend)["volumes"] if "secret" in v]
    assert "lorafleet-tokens" in secrets
    assert env_of(containers(frontend)[0])["DYN_ADMIN_TOKEN_FILE"] == "/data/secrets/admin_token"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_commands_and_variables_are_composes(overlay: str) -> None:
    services = compose_services()
    frontend = containers(named(overlay, "Deployment", "frontend"))[0]
    workers = worker_containers(overlay)
    assert workers, overlay
    pairs = [(frontend, services["frontend"])]
    pairs += [(w, services[COMPOSE_WORKER[env_of(w)["DYN_ENGINE"]]]) for w in workers]
    for container, service in pairs:
        assert container["image"] == service["image"]
        assert container["command"] == service["command"]
        env = env_of(container)
        for name, value in service["environment"].items():
            if value is not None and name not in PER_DEPLOYMENT:
                assert env.get(name) == value, (container["name"], name)
    for kind, name in (("StatefulSet", "etcd"), ("StatefulSet", "nats")):
        container = containers(named(overlay, kind, name))[0]
        assert container["image"] == services[name]["image"], name
    nats = containers(named(overlay, "StatefulSet", "nats"))[0]
    assert nats["command"][:4] == services["nats"]["command"]
    if overlay == "dev":
        for container in [frontend, *workers]:
            assert env_of(container)["ETCD_ENDPOINTS"] == "http://etcd:2379"
            assert env_of(container)["NATS_SERVER"] == "nats://nats:4222"


def declared_adapters(overlay: str) -> dict[str, list[str]]:
    """The adapters.txt lines of the overlay's adapters ConfigMap, by adapter name."""
    lines = named_configmap(overlay, "lorafleet-adapters")["adapters.txt"].splitlines()
    return {line.split()[0]: line.split() for line in lines if line and not line.startswith("#")}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_declared_adapters_name_a_base_the_workers_serve(overlay: str) -> None:
    """Placement puts an adapter only on workers serving its base model (by served name)."""
    served = {env_of(w)["DYN_SERVED_MODEL_NAME"] for w in worker_containers(overlay)}
    declared = declared_adapters(overlay)
    assert declared, overlay
    for name, (_, uri, *flags) in declared.items():
        assert re.fullmatch(r"(file|s3)://\S+", uri), name
        assert flags[flags.index("--base-model") + 1] in served, name
    apply = " ".join(containers(named(overlay, "Job", "lorafleet-adapters"))[0]["command"])
    adapters_job = " ".join(compose_services()["adapters"]["command"])
    for words in ("lorafleet lora apply", "--frontend http://frontend:8000"):
        assert words in apply and words in adapters_job, words


def test_dev_workers_build_composes_demo_adapters() -> None:
    adapters_job = " ".join(compose_services()["adapters"]["command"])
    build = containers(named("dev", "Deployment", "worker-mocker"))[0]
    assert build["image"] == compose_services()["adapters"]["image"]
    built_into = " ".join(build["command"]).replace(
        "/data/adapters/demo", "/data/adapters/.demo.tmp"
    )
    assert built_into in adapters_job
    for name, (_, uri, *flags) in declared_adapters("dev").items():
        assert uri == f"file:///data/adapters/demo/adapters/{name}"
        assert "--replicas all" in " ".join(flags) and "--replicas all" in adapters_job


def named_configmap(overlay: str, prefix: str) -> dict[str, str]:
    """The data of the generated ConfigMap whose name starts with ``prefix`` (plus a hash)."""
    found = [o for o in rendered(overlay) if o["kind"] == "ConfigMap"
             and o["metadata"]["name"].startswith(f"{prefix}-")]  # fmt: skip
    assert len(found) == 1, prefix
    data: dict[str, str] = found[0]["data"]
    return data


def test_prod_runs_etcd_with_tls_and_auth() -> None:
    etcd = containers(named("prod", "StatefulSet", "etcd"))[0]
    env = env_of(etcd)
    members = [f"etcd-{n}" for n in range(3)]
    assert env["ETCD_INITIAL_CLUSTER"].split(",") == [f"{m}=https://{m}.etcd:2380" for m in members]
    assert env["ETCD_LISTEN_CLIENT_URLS"].startswith("https://")
    assert env["ETCD_PEER_CLIENT_CERT_AUTH"] == "true"
    for name in ("ETCD_CERT_FILE", "ETCD_KEY_FILE", "ETCD_PEER_TRUSTED_CA_FILE"):
        assert env[name].startswith("/etc/etcd/tls/")
    # Clients log in with passwords: a client CA would make etcd demand their certificates.
    assert "ETCD_TRUSTED_CA_FILE" not in env and "ETCD_CLIENT_CERT_AUTH" not in env
    endpoints = ",".join(f"https://{m}.etcd:2379" for m in members)
    job = containers(named("prod", "Job", "etcd-auth"))[0]
    assert job["image"] == "lorafleet:etcd-auth" and env_of(job)["ETCD_ENDPOINTS"] == endpoints
    for container in [
        containers(named("prod", "Deployment", "frontend"))[0],
        *worker_containers("prod"),
    ]:
        client = env_of(container)
        assert client["ETCD_ENDPOINTS"] == endpoints
        assert client["ETCD_AUTH_USERNAME"] == env_of(job)["ETCD_AUTH_USERNAME"] == "lorafleet"
        assert client["ETCD_AUTH_CA"] == "/etc/etcd/tls/ca.crt"


def test_prod_runs_a_nats_cluster_with_the_shipped_users() -> None:
    nats = containers(named("prod", "StatefulSet", "nats"))[0]
    assert named("prod", "StatefulSet", "nats")["spec"]["replicas"] == 3
    command = nats["command"]
    assert command[command.index("-c") + 1] == "/etc/nats/auth.conf"
    routes = command[command.index("--routes") + 1].split(",")
    route_user = "route:$(LORAFLEET_NATS_ROUTE_PASSWORD)"
    assert routes == [f"nats://{route_user}@nats-{n}.nats:6222" for n in range(3)]
    auth = named_configmap("prod", "nats-auth")["auth.conf"]
    assert auth == (REPO / "deploy" / "nats" / "auth.conf").read_text()
    for variable in re.findall(r"\$(LORAFLEET_NATS_\w+)", auth):
        assert variable in env_of(nats), variable  # every variable auth.conf reads is set
    namespace = env_of(containers(named("prod", "Deployment", "frontend"))[0])["DYN_NAMESPACE"]
    assert env_of(nats)["LORAFLEET_NATS_SUBJECTS"] == f"{namespace}.>"
    users = {
        env_of(containers(named("prod", "Deployment", "frontend"))[0])["NATS_AUTH_USERNAME"],
        *(env_of(w)["NATS_AUTH_USERNAME"] for w in worker_containers("prod")),
    }
    assert users == {"frontend", "worker"}


def test_prod_frontends_scale_and_workers_hold_gpus_and_a_cache() -> None:
    hpa = named("prod", "HorizontalPodAutoscaler", "frontend")["spec"]
    assert hpa["scaleTargetRef"]["name"] == "frontend" and hpa["minReplicas"] >= 2
    assert named("prod", "Deployment", "frontend")["spec"]["replicas"] >= 2
    pool = named("prod", "StatefulSet", "worker-vllm")
    worker = containers(pool)[0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
    cache = [v["mountPath"] for v in worker["volumeMounts"] if v["name"] == "cache"]
    claims = [c["metadata"]["name"] for c in pool["spec"]["volumeClaimTemplates"]]
    assert cache == ["/data/cache"] and claims == ["cache"]
    assert env_of(worker)["DYN_LORA_PATH"].startswith("/data/cache/")
    assert worker["envFrom"] == [{"secretRef": {"name": "lorafleet-s3"}}]
