"""Long outage tests, run by ``make test-chaos``: minutes of NATS and etcd down, kills under load.

Each scenario lives beside its short version in the main suite and is called here with
the durations the issues name; ``make test`` leaves this folder out.
"""
