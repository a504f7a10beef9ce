"""The etcd side: connection, lease, records bound to it, key layout and a watch cache."""
