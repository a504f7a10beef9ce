"""The frontend process: OpenAI API, model registry from etcd, router, NATS client."""
