"""`make venv` asks scripts/torch_index.py whether to add PyTorch's CPU index: it must say
yes to an index that answers and fall back at once, silently for pip, when none does.

Real sockets and the real script: a listener stands in for the index (no internet here).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from lorafleet.launch.local_servers import free_port

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "torch_index.py"
FALLBACK_BOUND_S = 30  # the probe waits 3 s at most; pip's own retries took minutes


def _ask(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), url], capture_output=True, text=True,
                          timeout=FALLBACK_BOUND_S)  # fmt: skip


def test_an_index_that_answers_is_added_as_an_extra_index() -> None:
    with socket.socket() as index:
        index.bind(("127.0.0.1", 0))
        index.listen()
        url = f"http://127.0.0.1:{index.getsockname()[1]}/whl/cpu"
        result = _ask(url)
    assert result.stdout.split() == ["--extra-index-url", url]


def test_an_unreachable_index_adds_nothing_and_says_why() -> None:
    url = f"http://127.0.0.1:{free_port()}/whl/cpu"
    result = _ask(url)
    assert result.returncode == 0
    assert result.stdout == ""
    assert "unreachable" in result.stderr and "TORCH_INDEX_URL=" in result.stderr


def test_an_empty_url_skips_the_probe() -> None:
    result = _ask("")
    assert (result.stdout, result.stderr) == ("", "")
