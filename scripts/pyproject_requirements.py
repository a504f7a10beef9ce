"""Print the requirements that pyproject.toml declares, one a line, for `pip install -r`.

The Dockerfile installs dependencies from this list in a layer of their own, so that
editing the code rebuilds only the thin layer that installs lorafleet itself.
Usage: `python pyproject_requirements.py [--base] [EXTRA ...]`.
"""

import sys
import tomllib
from pathlib import Path
from typing import Final

PYPROJECT: Final = Path("pyproject.toml")


def requirements(pyproject: Path, extras: list[str], *, base: bool) -> list[str]:
    """Return the base dependencies (when `base`) followed by those of each extra.

    Raises:
        SystemExit: an extra that pyproject.toml does not declare (a typo in the Dockerfile).
    """
    project = tomllib.loads(pyproject.read_text())["project"]
    optional: dict[str, list[str]] = project.get("optional-dependencies", {})
    unknown = [extra for extra in extras if extra not in optional]
    if unknown:
        raise SystemExit(f"extras {unknown} not in {pyproject} (known: {sorted(optional)})")
    found: list[str] = list(project["dependencies"]) if base else []
    for extra in extras:
        found.extend(optional[extra])
    return found


def main(argv: list[str]) -> None:
    """Print the requirements for the command line `[--base] [EXTRA ...]`."""
    base = "--base" in argv
    extras = [arg for arg in argv if arg != "--base"]
    print("\n".join(requirements(PYPROJECT, extras, base=base)))


if __name__ == "__main__":
    main(sys.argv[1:])
