"""Committing a download into the shared adapter cache, as several workers on one disk do."""

from __future__ import annotations

from pathlib import Path

from lorafleet.worker.lora.cache import AdapterCache
from tests.worker.lora.conftest import write_adapter


def _built(cache: AdapterCache, key: str, marker: str) -> Path:
    built = cache.new_download_dir(key)
    write_adapter(built)
    (built / "which").write_text(marker)
    return built


def test_a_refresh_keeps_the_entry_another_worker_committed_at_that_version(
    tmp_path: Path,
) -> None:
    cache = AdapterCache(tmp_path / "cache")
    entry = cache.commit("s3_fx", _built(cache, "s3_fx", "old"), version="v1")
    assert cache.commit("s3_fx", _built(cache, "s3_fx", "first"), version="v2", replace=True)
    again = _built(cache, "s3_fx", "second")
    assert cache.commit("s3_fx", again, version="v2", replace=True) == entry
    assert (entry / "which").read_text() == "first"  # not pulled from under its loader
    assert again.exists()  # left for the caller to discard
    assert cache.commit("s3_fx", _built(cache, "s3_fx", "third"), version="v3", replace=True)
    assert (entry / "which").read_text() == "third"
