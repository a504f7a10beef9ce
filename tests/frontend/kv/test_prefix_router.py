"""The prefix router's choice: cached prefix against load, per version, and its fallbacks."""

from __future__ import annotations

import threading
import time
from typing import Any

from prometheus_client import CollectorRegistry

from lorafleet.fleet.kv_blocks import block_hashes, version_key, words_tokens
from lorafleet.frontend.card_view import CardView
from lorafleet.frontend.kv.prefix_index import PrefixIndex
from lorafleet.frontend.kv.prefix_memory import PrefixMemory
from lorafleet.frontend.kv.prefix_router import PrefixRouter
from lorafleet.frontend.kv.prompt_blocks import HfTokenizers
from lorafleet.frontend.kv.routing_metrics import RoutingMetrics
from lorafleet.frontend.registry import ServedModel
from lorafleet.proto.discovery import Instance
from lorafleet.proto.inference import ChatMessage, GenerateRequest, SamplingParams
from lorafleet.proto.kv_events import BlocksStored, KvCacheSpec

SYSTEM = " ".join(f"rule{n}" for n in range(200))
WORDS = KvCacheSpec(block_size=16, num_blocks=1024)


def _instances(count: int, spec: KvCacheSpec | None = WORDS) -> list[Instance]:
    return [
        Instance(namespace="ns", component="backend", endpoint="generate", instance_id=i,
                 subject=f"ns.backend.generate-{i:x}", kv_cache=spec)
        for i in range(1, count + 1)
    ]  # fmt: skip


def _card(name: str, digest: str = "", parent: str | None = None) -> CardView:
    return CardView(name=name, parent=parent, source="", model_type=("chat",), context_length=0,
                    enable_lora=True, max_lora_rank=0, created=0, digest=digest)  # fmt: skip


def _request(question: str, *, model: str = "demo", salt: str = "") -> GenerateRequest:
    messages = [
        ChatMessage(role="system", content=SYSTEM),
        ChatMessage(role="user", content=question),
    ]
    return GenerateRequest(request_id=question, model=model, messages=messages,
                           sampling=SamplingParams(max_tokens=8), cache_salt=salt)  # fmt: skip


class _Fleet:
    """A router over ``count`` instances whose cards say ``digests`` (per instance)."""

    def __init__(self, count: int, *, model: str = "demo", digests: dict[int, str] | None = None,
                 spec: KvCacheSpec | None = WORDS, follows: bool = True) -> None:  # fmt: skip
        self.registry = CollectorRegistry()
        self.index = PrefixIndex()
        self.instances = _instances(count, spec)
        self.digests = digests or {}
        parent = None if model == "demo" else "demo"
        self.served = ServedModel(name=model, card=_card(model, parent=parent),
                                  instances=tuple(self.instances))  # fmt: skip
        self.metrics = RoutingMetrics(self.registry)
        self.router = PrefixRouter(
            metrics=self.metrics, cards=self.card, memory=PrefixMemory(),
            index=self.index, follows=lambda _iid: follows,
        )  # fmt: skip

    def card(self, name: str, instance_id: int) -> CardView:
        parent = None if name == "demo" else "demo"
        return _card(name, self.digests.get(instance_id, ""), parent)

    def hold(self, instance_id: int, text: str, *, version: str, salt: str = "") -> None:
        tokens = words_tokens([text])
        hashes = block_hashes(tokens, WORDS.block_size, version, salt)
        self.index.apply(instance_id, [BlocksStored(version=version, hashes=hashes)])

    def route(self, request: GenerateRequest) -> int:
        chosen = self.router.route(self.served, request)
        assert chosen is not None
        return chosen.instance_id

    def decisions(self, reason: str) -> float:
        value = self.registry.get_sample_value(
            "lorafleet_router_decisions_total", {"reason": reason}
        )
        return value or 0.0


def test_a_shared_prefix_goes_to_the_instance_that_holds_it() -> None:
    fleet = _Fleet(4)
    fleet.hold(3, SYSTEM, version="demo")
    assert {fleet.route(_request(f"question {n}")) for n in range(5)} == {3}
    assert fleet.decisions("overlap") == 5


def test_an_adapter_routes_by_the_version_each_instance_holds() -> None:
    fleet = _Fleet(2, model="tone", digests={1: "sha256:old", 2: "sha256:new"})
    fleet.hold(1, SYSTEM, version=version_key("tone", "sha256:new"))  # a stale claim: no match
    fleet.hold(2, SYSTEM, version=version_key("tone", "sha256:new"))
    assert fleet.route(_request("q", model="tone")) == 2


def test_a_salted_request_never_matches_unsalted_blocks() -> None:
    fleet = _Fleet(2)
    fleet.hold(1, SYSTEM, version="demo")
    fleet.hold(2, SYSTEM, version="demo", salt="acme")
    assert fleet.route(_request("q", salt="acme")) == 2
    assert fleet.route(_request("q")) == 1


def test_a_busy_holder_sheds_to_another_instance() -> None:
    fleet = _Fleet(2)
    fleet.hold(1, SYSTEM, version="demo")
    fleet.router.started(1, tokens=100)  # busier, by less than the 192 tokens it saves
    assert fleet.route(_request("q")) == 1
    fleet.router.started(1, tokens=1_000)  # now by more
    assert fleet.route(_request("q1")) == 2
    assert fleet.decisions("load") == 1


def test_loads_of_the_same_whole_prompts_tie_and_the_one_sent_to_least_lately_wins() -> None:
    """The frontend cannot see how far an instance is through what it was sent, so a few
    tokens less in flight is no reason to choose it: as under least-inflight, the instance
    sent to least lately (its work began earliest) wins. Deciding by the token sums raised
    TTFT p90 on prompts that share nothing 18% over least-inflight's under Poisson arrivals
    (``bench.prefix --rate 40``)."""
    fleet = _Fleet(2)
    prompt_tokens = (len(SYSTEM) + len("unheld")) // 4  # nobody holds it: its estimate
    fleet.router.started(1, tokens=prompt_tokens)  # a prompt like it, sent first
    fleet.router.started(2, tokens=1)
    fleet.router.finished(2, tokens=1)  # then one more request to 2 since
    fleet.router.started(2, tokens=prompt_tokens * 19 // 20)  # a prompt 5% shorter
    assert fleet.route(_request("unheld")) == 1


def test_without_events_the_router_remembers_where_it_sent_a_prefix() -> None:
    fleet = _Fleet(4, spec=None)
    first = fleet.route(_request("first"))
    assert {fleet.route(_request(f"then {n}")) for n in range(5)} == {first}
    assert fleet.decisions("approximate") == 5


def test_an_instance_not_followed_yet_is_routed_approximately() -> None:
    fleet = _Fleet(2, follows=False)
    fleet.hold(2, SYSTEM, version="demo")  # not trusted until its snapshot came
    first = fleet.route(_request("first"))
    assert fleet.route(_request("second")) == first
    assert fleet.decisions("overlap") == 0


def test_a_prompt_no_instance_holds_is_weighed_by_its_characters_not_counted() -> None:
    """Nobody holds its first block, so the choice is by load alone: its words are not
    counted (on a 600-word prompt that was a fifth of the route), and the load it
    adds is its characters' estimate, as in the approximate mode. A prompt that hits is
    counted: its load is its uncached words."""
    fleet = _Fleet(2)
    cold = _request("cold")
    chosen = fleet.route(cold)
    assert fleet.router.load_of(cold, chosen) == (len(SYSTEM) + len("cold")) // 4 + 8
    fleet.hold(chosen, SYSTEM, version="demo")
    warm = _request("warm")
    assert fleet.route(warm) == chosen
    assert fleet.router.load_of(warm, chosen) == 201 - 192 + 8  # 12 blocks of 16 words held


def test_a_short_prompt_or_a_single_instance_costs_no_tokenization() -> None:
    loaded: list[str] = []
    hf = KvCacheSpec(block_size=16, num_blocks=64, tokenizer="hf", tokenizer_path="/model")
    fleet = _Fleet(2, spec=hf)
    fleet.router = PrefixRouter(
        metrics=RoutingMetrics(CollectorRegistry()), cards=fleet.card, memory=PrefixMemory(),
        index=fleet.index, follows=lambda _iid: True,
        tokenizers=HfTokenizers(lambda path: loaded.append(path)),
    )  # fmt: skip
    short = GenerateRequest(request_id="r", model="demo", prompt="hello there")
    assert fleet.router.route(fleet.served, short) is not None
    assert fleet.router.route(fleet.served, _request("long"), exclude={1}) is not None
    assert loaded == []


def test_an_index_failure_routes_by_load_instead() -> None:
    fleet = _Fleet(2)

    def broken(_name: str, _instance_id: int) -> CardView:
        raise RuntimeError("index bug")

    fleet.router = PrefixRouter(metrics=fleet.metrics, cards=broken,
                                memory=PrefixMemory(), index=fleet.index)  # fmt: skip
    fleet.router.started(1)
    assert fleet.route(_request("q")) == 2
    assert fleet.decisions("no_index") == 1


def test_a_tokenizer_loads_off_the_event_loop_and_serves_once_ready() -> None:
    """Loading one imports transformers (seconds): the router routes approximately until
    the load, in a thread of its own, is done, and never waits for it."""
    release = threading.Event()
    tokenizer = object()

    def slow_load(path: str) -> Any:
        release.wait(10)
        return tokenizer

    tokenizers = HfTokenizers(slow_load)
    assert tokenizers.get("/model") is None  # started, not waited for
    release.set()
    deadline = time.monotonic() + 10
    while tokenizers.get("/model") is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tokenizers.get("/model") is tokenizer


def test_every_decision_reason_is_on_metrics_at_zero_before_any_request() -> None:
    """A dashboard's rate of ``load`` decisions reads 0, not "no data", until one happens."""
    registry = CollectorRegistry()
    RoutingMetrics(registry)
    for reason in ("overlap", "load", "approximate", "no_index"):
        assert registry.get_sample_value(
            "lorafleet_router_decisions_total", {"reason": reason}
        ) == 0.0  # fmt: skip
