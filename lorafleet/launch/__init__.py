"""The lorafleet command: local cluster, CLI, local etcd and NATS servers, demo model."""
