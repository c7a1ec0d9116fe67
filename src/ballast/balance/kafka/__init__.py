"""Kafka's family in the decision core: the minimal-movement replica planner
(`replicas`, with its cluster-wide `targets`) and the `kafka-reassign-partitions` format
(`reassignment`). Pure: no I/O, no cluster state beyond what is passed in."""
