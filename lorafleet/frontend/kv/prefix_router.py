"""The prefix-aware router: send a request where its prompt is cached, unless that costs more
than it saves.

For every instance that may serve the request (adapter affinity stays: ``served.instances``
hold the adapter, aliases and canaries are resolved before), ``cost = uncached prompt
tokens + load_weight x tokens the instance is working on`` (this frontend's requests in
flight there: their uncached prompt and up to ``DECODE_LOAD_TOKENS`` of output each); the
cheapest wins. Among the candidates that would compute as much of the prompt as it, loads
that round to the same number of whole prompts of the request's size tie, and the fewest in
flight, then the one sent to least lately, wins. The cached prefix comes from the index of the
workers' events (``PrefixIndex``) for an instance whose events this frontend follows (and
what was sent there in the last seconds, ``RecentSends``, still in prefill), else from
where it sent prefixes lately (``PrefixMemory``, the approximate mode; the only one of
``prefix-approx``). A hot prefix thus spreads once its holder is busier than a
recompute costs. The index never fails a request: any error routes by least in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from typing import Final

import structlog

from lorafleet.fleet.kv_blocks import BlockChain, version_key
from lorafleet.frontend.card_view import CardView
from lorafleet.frontend.kv.prefix_index import PrefixIndex
from lorafleet.frontend.kv.prefix_memory import PrefixMemory
from lorafleet.frontend.kv.prompt_blocks import CHARS_PER_BLOCK, HfTokenizers, PromptBlocks
from lorafleet.frontend.kv.recent_sends import RecentSends
from lorafleet.frontend.kv.routing_metrics import DecisionReason, RoutingMetrics
from lorafleet.frontend.registry import ServedModel
from lorafleet.frontend.router import Router
from lorafleet.proto.discovery import Instance
from lorafleet.proto.inference import GenerateRequest
from lorafleet.proto.kv_events import KvCacheSpec

__all__ = ["DECODE_LOAD_TOKENS", "PrefixRouter"]

log = structlog.get_logger(__name__)

DECODE_LOAD_TOKENS: Final = 256
"""Output tokens a request in flight counts for at most in its instance's load."""


@dataclass(slots=True)
class _Score:
    """One candidate's side of a decision: its cached and uncached prompt tokens, and the
    prompt's blocks as it names them when the index follows it (else None)."""

    instance: Instance
    cached: int
    uncached: int
    from_index: bool
    chain: BlockChain | None = None


class PrefixRouter(Router):
    """Weighs each candidate's cached prefix of a request against its load."""

    def __init__(
        self,
        *,
        metrics: RoutingMetrics,
        cards: Callable[[str, int], CardView | None],
        memory: PrefixMemory,
        index: PrefixIndex | None = None,
        follows: Callable[[int], bool] = lambda _instance_id: False,
        tokenizers: HfTokenizers | None = None,
        load_weight: float = 0.5,
    ) -> None:
        super().__init__()
        self.metrics = metrics
        self.memory = memory
        self.index = index
        self.recent = RecentSends()
        self.load_weight = load_weight
        self._cards = cards
        self._follows = follows
        """Whether the index follows an instance's events now (else: approximate)."""
        self._tokenizers = tokenizers or HfTokenizers()
        self._load_tokens: dict[int, int] = {}
        self._last: tuple[GenerateRequest, PromptBlocks, dict[int, int]] | None = None
        """The request routed last, its blocks and its uncached tokens per candidate."""

    def pick(
        self, model: str, instances: Sequence[Instance], exclude: Container[int] = ()
    ) -> Instance | None:
        return self.pick_least_inflight(model, instances, exclude)

    def route(
        self, served: ServedModel, request: GenerateRequest, exclude: Container[int] = ()
    ) -> Instance | None:
        candidates = [i for i in served.instances if i.instance_id not in exclude]
        try:
            chosen = self._by_prefix(served, request, candidates)
        except Exception as exc:  # the index must never fail a request
            log.warning("prefix routing failed; routing by load", model=served.name,
                        error=repr(exc))  # fmt: skip
            chosen = None
        if chosen is None:
            self.metrics.decided("no_index")
            return self.pick_least_inflight(served.name, candidates)
        return chosen

    def load_of(self, request: GenerateRequest, instance_id: int) -> int:
        decode = min(request.sampling.max_tokens, DECODE_LOAD_TOKENS)
        if self._last is not None and self._last[0] is request:
            uncached = self._last[2].get(instance_id)
            if uncached is not None:
                return uncached + decode
            return self._last[1].estimated_tokens + decode
        return decode

    def started(self, instance_id: int, tokens: int = 0) -> None:
        super().started(instance_id, tokens)
        self._load_tokens[instance_id] = self._load_tokens.get(instance_id, 0) + tokens

    def finished(self, instance_id: int, tokens: int = 0) -> None:
        super().finished(instance_id, tokens)
        left = self._load_tokens.get(instance_id, 0) - tokens
        if left > 0:
            self._load_tokens[instance_id] = left
        else:
            self._load_tokens.pop(instance_id, None)

    def _by_prefix(
        self, served: ServedModel, request: GenerateRequest, candidates: list[Instance]
    ) -> Instance | None:
        """The cheapest candidate, counted and remembered; None when the prompt is too short
        to route by or there is no choice to make."""
        if len(candidates) < 2:
            return None
        prompt = self._prompt(request)
        if prompt.chars < CHARS_PER_BLOCK:
            return None
        scores = self._scores(served.name, prompt, candidates)
        self._last = (request, prompt, {s.instance.instance_id: s.uncached for s in scores})
        cheapest = min(scores, key=self._cost)
        best = min((s for s in scores if s.uncached == cheapest.uncached), key=self._tie)
        if best.chain is not None:
            self.recent.remember(best.chain, best.instance.instance_id)
        else:
            version = self._version(served.name, best.instance)
            self.memory.remember(prompt.char_hashes(version), best.instance.instance_id)
        self.metrics.decided(_reason(best, scores), best.cached)
        return best.instance

    def _prompt(self, request: GenerateRequest) -> PromptBlocks:
        """The request's blocks, shared by every try of one request."""
        if self._last is not None and self._last[0] is request:
            return self._last[1]
        return PromptBlocks(request, self._tokenizers)

    def _cost(self, score: _Score) -> float:
        load = self._load_tokens.get(score.instance.instance_id, 0)
        return score.uncached + self.load_weight * load

    def _tie(self, score: _Score) -> tuple[int, int, float]:
        """Among candidates that would compute as much of the prompt: the least loaded in
        whole prompts of this request's size, then the fewest in flight, then the one sent
        to least lately (its work began earliest). The frontend cannot see how far an
        instance is through what it was sent, so a fraction of a prompt more in flight is
        no real difference; letting raw sums decide (prompt lengths a few percent apart)
        raised TTFT p90 on prompts that share nothing 18% over least-inflight's under
        Poisson arrivals (``bench.prefix --rate``)."""
        iid = score.instance.instance_id
        size = max(1, score.cached + score.uncached)
        return (round(self._load_tokens.get(iid, 0) / size), self.inflight(iid), self.sent(iid))

    def _version(self, model: str, instance: Instance) -> str:
        """The version of ``model`` that ``instance`` holds: the block chains' seed."""
        card = self._cards(model, instance.instance_id)
        return version_key(model, card.digest if card is not None else "")

    def _scores(self, model: str, prompt: PromptBlocks, candidates: list[Instance]) -> list[_Score]:
        """Each candidate's score, in their order. Instances the index follows are scored
        together per cache shape and version (one walk of the prompt's blocks for all);
        the others from where prefixes were sent."""
        scores: dict[int, _Score] = {}
        followed: dict[tuple[KvCacheSpec, str], list[Instance]] = {}
        for instance in candidates:
            version = self._version(model, instance)
            spec = instance.kv_cache
            if self.index is not None and spec is not None and spec.events \
                    and self._follows(instance.instance_id):  # fmt: skip
                followed.setdefault((spec, version), []).append(instance)
            else:
                scores[instance.instance_id] = self._remembered(prompt, version, instance)
        for (spec, version), group in followed.items():
            for score in self._indexed(prompt, spec, version, group):
                scores[score.instance.instance_id] = score
        return [scores[instance.instance_id] for instance in candidates]

    def _indexed(
        self, prompt: PromptBlocks, spec: KvCacheSpec, version: str, group: list[Instance]
    ) -> list[_Score]:
        """What of the prompt each of ``group`` holds by the index (or, if more, by what was
        sent there lately, still in prefill); from where prefixes were sent when the
        frontend cannot make the engine's tokens."""
        chain = prompt.token_chain(spec, version)
        if chain is None or self.index is None:
            return [self._remembered(prompt, version, instance) for instance in group]
        ids = [instance.instance_id for instance in group]
        held = self.index.overlaps(chain, ids)
        recent = self.recent.held_blocks(chain, ids)
        # words counted only if a candidate holds its first block (else the choice is by load)
        counted = prompt.token_count(spec, count=bool(held or recent))
        total = prompt.estimated_tokens if counted is None else counted
        scores = []
        for instance in group:
            blocks, sent = held.get(instance.instance_id, 0), recent.get(instance.instance_id, 0)
            cached = min(total, max(blocks, sent) * spec.block_size)
            scores.append(_Score(instance, cached, total - cached, from_index=blocks >= sent,
                                 chain=chain))  # fmt: skip
        return scores

    def _remembered(self, prompt: PromptBlocks, version: str, instance: Instance) -> _Score:
        """What of the prompt ``instance`` was sent lately (the approximate mode)."""
        iid = instance.instance_id
        total = prompt.estimated_tokens
        held = self.memory.overlaps(prompt.char_hashes(version), (iid,)).get(iid, 0)
        cached = min(total, total * held * CHARS_PER_BLOCK // max(1, prompt.text_bytes))
        return _Score(instance, cached, total - cached, from_index=False)


def _reason(best: _Score, scores: list[_Score]) -> DecisionReason:
    """Why ``best`` won among ``scores``."""
    most = max(s.cached for s in scores)
    if most == 0:
        return "no_index"
    if best.cached < most:
        return "load"
    return "overlap" if best.from_index else "approximate"
