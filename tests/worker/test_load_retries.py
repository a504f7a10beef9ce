"""Failed placement loads: backoff, redaction, and forgetting; with a hand-driven clock."""

from __future__ import annotations

from lorafleet.proto.adapters import LoraSource
from lorafleet.proto.errors import ConflictError, NotFoundError
from lorafleet.worker.load_retries import RETRY_CAP_S, LoadRetries
from lorafleet.worker.lora.errors import adapter_too_big
from tests.hand_clock import HandClock


def test_a_failed_load_waits_for_its_backoff_and_success_forgets_it() -> None:
    clock = HandClock()
    retries = LoadRetries(clock=clock)
    error = NotFoundError("no adapter at s3://key:secret@bucket/pirate?X-Amz-Signature=abc")
    retries.failed("pirate", "s3://key:secret@bucket/pirate?X-Amz-Signature=abc", error)
    failure = retries.failures["pirate"]
    assert failure.code == "not_found" and failure.attempts == 1
    assert "secret" not in failure.message and "abc" not in failure.message
    assert failure.at <= failure.retry_at <= failure.at + RETRY_CAP_S
    clock.now = failure.retry_at
    assert retries.due("pirate")

    retries.failed("pirate", "s3://bucket/pirate", error)
    assert retries.failures["pirate"].attempts == 2
    retries.succeeded("pirate")
    assert retries.failures == {} and retries.due("pirate")


def test_failures_of_adapters_no_longer_placed_are_forgotten() -> None:
    retries = LoadRetries()
    retries.failed("a", "file:///a", NotFoundError("gone"))
    retries.failed("b", "file:///b", NotFoundError("gone"))
    retries.retain({"b"})
    assert set(retries.failures) == {"b"}


def test_a_changed_source_is_due_at_once_the_same_one_waits_for_its_backoff() -> None:
    clock = HandClock()
    retries = LoadRetries(clock=clock)
    wrong = LoraSource(uri="s3://bucket/pirate", sha256="0" * 64)
    retries.failed("pirate", wrong.uri, ConflictError("digest differs"), wrong)
    assert not retries.due("pirate", wrong)
    assert retries.due("pirate", LoraSource(uri="s3://bucket/pirate", sha256="1" * 64))


def test_a_load_refused_for_size_is_not_retried_until_its_source_changes() -> None:
    clock = HandClock()
    retries = LoadRetries(clock=clock)
    bomb = LoraSource(uri="s3://bucket/bomb.tar.gz")
    refused = adapter_too_big(bomb.uri, 16 << 20, 8 << 20)
    retries.failed("bomb", bomb.uri, refused, bomb)
    failure = retries.failures["bomb"]
    assert failure.code == "invalid_request" and "DYN_LORA_MAX_BYTES" in failure.message
    assert failure.retry_at == 0.0 and retries.next_retry_in_s() is None

    clock.now += 10 * RETRY_CAP_S
    assert not retries.due("bomb", bomb)
    assert retries.due("bomb", LoraSource(uri="s3://bucket/smaller.tar.gz"))
