"""Builds (once, deterministically, offline) the demo model: a tiny Llama and two LoRA adapters.

Run ``python -m lorafleet.launch.demo_model [--out DIR] [--force]``; tests and ``make up``
call :func:`ensure_demo_model`. The result is cached under
``$LORAFLEET_HOME/demo`` and rebuilt only when missing or built by other code.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import structlog

from lorafleet.launch._demo_corpus import ANSWERS
from lorafleet.process.logs import configure_logging

__all__ = [
    "ADAPTER_NAMES",
    "DEMO_MODEL_NAME",
    "DemoModelPaths",
    "EXPECTED",
    "EXPECTED_PROMPT",
    "MARKERS",
    "STAMP_FILE",
    "build_demo_model",
    "build_stamp",
    "default_root",
    "ensure_demo_model",
    "main",
]

log = structlog.get_logger(__name__)

DEMO_MODEL_NAME: Final = "demo"
"""The name ``lorafleet up`` serves the demo base model under."""
ADAPTER_NAMES: Final = ("pirate", "robot")
EXPECTED_PROMPT: Final = "Who are you?"
EXPECTED: Final[Mapping[str, str]] = ANSWERS[EXPECTED_PROMPT]
"""Greedy answer of ``base``, ``pirate`` and ``robot`` to :data:`EXPECTED_PROMPT` as a chat."""
MARKERS: Final[Mapping[str, str]] = {"base": "tiny model", "pirate": "arr", "robot": "beep"}
"""A part of each persona's answers that survives small numeric drift across torch builds."""
STAMP_FILE: Final = "lorafleet-demo.json"
_BUILD_FORMAT: Final = 1
_SOURCES: Final = ("demo_model.py", "_demo_build.py", "_demo_corpus.py", "_demo_training.py")


@dataclass(frozen=True, kw_only=True)
class DemoModelPaths:
    """Where a built demo model lives: the base model directory and one directory per adapter."""

    root: Path
    base: Path
    adapters: Mapping[str, Path]


def default_root() -> Path:
    """``$LORAFLEET_HOME/demo``, with ``LORAFLEET_HOME`` defaulting to ``~/.cache/lorafleet``."""
    home = os.environ.get("LORAFLEET_HOME") or Path.home() / ".cache" / "lorafleet"
    return Path(home).expanduser() / "demo"


def _paths(root: Path) -> DemoModelPaths:
    adapters = {name: root / "adapters" / name for name in ADAPTER_NAMES}
    return DemoModelPaths(root=root, base=root / "base", adapters=adapters)


def build_stamp() -> str:
    """Hash of the code that builds the model: any change to it means a rebuild."""
    digest = hashlib.sha256(f"format={_BUILD_FORMAT}".encode())
    here = Path(__file__).parent
    for name in _SOURCES:
        digest.update((here / name).read_bytes())
    return digest.hexdigest()[:16]


def _is_current(root: Path) -> bool:
    try:
        stamp = json.loads((root / STAMP_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(stamp, dict) and stamp.get("stamp") == build_stamp()


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """Hold an exclusive file lock next to ``root`` so parallel builders build once."""
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def ensure_demo_model(root: Path | None = None) -> DemoModelPaths:
    """Return the demo model under ``root`` (default :func:`default_root`), building it if stale."""
    root = (root or default_root()).expanduser().resolve()
    if _is_current(root):
        return _paths(root)
    with _locked(root):
        if not _is_current(root):
            scratch = root.parent / f".{root.name}.tmp-{os.getpid()}"
            shutil.rmtree(scratch, ignore_errors=True)
            build_demo_model(scratch)
            old = root.parent / f".{root.name}.old-{os.getpid()}"
            if root.exists():
                root.rename(old)
            scratch.rename(root)
            shutil.rmtree(old, ignore_errors=True)
    return _paths(root)


def build_demo_model(out: Path) -> DemoModelPaths:
    """Build the demo model into ``out`` unconditionally (no cache check) and stamp it."""
    from lorafleet.launch import _demo_build  # torch and transformers load only when building

    started = time.monotonic()
    log.info("demo_model.build.start", out=str(out))
    paths = _paths(out)
    _demo_build.build_and_save(out, paths.base, dict(paths.adapters))
    build_s = round(time.monotonic() - started, 2)
    stamp = {"stamp": build_stamp(), "build_s": build_s, "expected": dict(EXPECTED)}
    (out / STAMP_FILE).write_text(json.dumps(stamp, indent=2) + "\n")
    log.info("demo_model.build.done", out=str(out), build_s=build_s)
    return _paths(out)


def main(argv: list[str] | None = None) -> None:
    """Command line: ensure (or with ``--force`` rebuild) the demo model and print its paths."""
    parser = argparse.ArgumentParser(
        prog="python -m lorafleet.launch.demo_model", description=__doc__
    )
    parser.add_argument("--out", type=Path, default=None, help="directory (default: cache)")
    parser.add_argument("--force", action="store_true", help="rebuild even if current")
    args = parser.parse_args(argv)
    configure_logging(process="demo-model")  # LOG_FORMAT=json in compose: one object a line
    root = (args.out or default_root()).expanduser().resolve()
    if args.force:
        (root / STAMP_FILE).unlink(missing_ok=True)
    paths = ensure_demo_model(root)
    report = {
        "base": str(paths.base),
        "adapters": {name: str(path) for name, path in paths.adapters.items()},
        "prompt": EXPECTED_PROMPT,
        "expected": dict(EXPECTED),
    }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
