"""The worker process: request plane over NATS, engines, LoRA lifecycle, status server."""
