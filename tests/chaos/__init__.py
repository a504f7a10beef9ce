"""Long outage tests, run by ``make test-chaos``: minutes of NATS and etcd down, kills under load.

Each scenario is written once (``tests/etcd_scenarios.py``, ``tests/nats_faults.py``,
``tests/nats_partitions.py``, ...) and called here with the durations the issues name;
``make test`` leaves this folder out. Some keep a short form in the main suite; the
slowest short forms that only repeated the long one with less time (20-30 s each) run
here alone, to keep ``make test`` short (issue 39, item 14). CI runs both suites.
"""
