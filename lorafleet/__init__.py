"""lorafleet: serve LLMs with dynamic LoRA adapters across a fleet of workers.

Every import name lorafleet installs starts here. The packages live in the
repository's top-level folders (``proto/``, ``discovery/``, ``worker/``, ...);
this folder holds links to them, so that one tree serves the repository's layout,
the wheel and mypy alike (docs/decisions.md, "One import namespace").
"""
