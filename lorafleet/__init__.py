"""lorafleet: serve LLMs with dynamic LoRA adapters across a fleet of workers.

Every import name lorafleet installs starts here: ``lorafleet.proto``, ``lorafleet.worker``,
``lorafleet.frontend``, ... (docs/decisions.md, "One import namespace").
"""
