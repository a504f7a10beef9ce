"""No path on a worker's disk leaves through the frontend, whatever way an adapter fails.

A real hf worker on the demo model (``--max-lora-rank 1``: every demo adapter is too
big) and the frontend in the test's loop. Each failing kind the tests know is applied
from a folder with a telltale name; every answer a caller without a token can get
(the 424, ``/v1/adapters``, ``/v1/adapters/{name}``, ``/v1/models``) must not hold it.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from lorafleet.launch.demo_model import DEMO_MODEL_NAME, DemoModelPaths
from tests.frontend.conftest import wait_for_models
from tests.frontend.test_on_demand import _apply, _complete
from tests.processes import start_worker
from tests.worker.adapters import make_adapter_dir

pytestmark = pytest.mark.slow

TELLTALE = "secret-team-7f3a"


def _failing_adapters(root: Path, demo: DemoModelPaths) -> dict[str, Path]:
    """One folder per failing kind, each under ``root/TELLTALE/ad``."""
    folder = root / TELLTALE / "ad"
    hollow = folder / "hollow"
    hollow.mkdir(parents=True)
    garbled = make_adapter_dir(folder, "garbled")
    (garbled / "adapter_config.json").write_text("{oops")
    bigrank = folder / "bigrank"
    shutil.copytree(next(iter(demo.adapters.values())), bigrank)
    return {"ghost": folder / "ghost", "hollow": hollow, "garbled": garbled, "bigrank": bigrank}


async def test_no_answer_or_listing_shows_a_path_of_a_failed_adapter(
    demo: DemoModelPaths, frontend, etcd_url, nats_url, namespace, tmp_path
) -> None:
    env = {"DYN_LORA_ENABLED": "true", "DYN_LORA_PATH": str(tmp_path / "cache")}
    args = ("--engine", "hf", "--served-model-name", DEMO_MODEL_NAME, "--enable-lora",
            "--max-lora-rank", "1")  # fmt: skip
    worker = await asyncio.to_thread(
        start_worker, tmp_path, etcd_url=etcd_url, nats_url=nats_url, namespace=namespace,
        model=str(demo.base), args=args, env=env,
    )  # fmt: skip
    try:
        await wait_for_models(frontend, {DEMO_MODEL_NAME}, timeout_s=60)
        adapters = _failing_adapters(tmp_path, demo)
        answers = []
        for name, path in adapters.items():
            await _apply(frontend.http, name, f"file://{path}", base_model=DEMO_MODEL_NAME)
            refused = await _complete(frontend.http, name)
            assert refused.status_code == 424, refused.text
            answers.append(refused.text)
            answers.append((await frontend.http.get(f"/v1/adapters/{name}")).text)
        answers.append((await frontend.http.get("/v1/adapters")).text)
        answers.append((await frontend.http.get("/v1/models")).text)
    finally:
        worker.kill()
    assert "'bigrank' has rank 8" in " ".join(answers)  # why is shown (unplaceable), paths not
    leaks = [answer for answer in answers if TELLTALE in answer or str(tmp_path) in answer]
    assert leaks == []
