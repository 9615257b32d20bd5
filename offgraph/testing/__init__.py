"""Helpers for tests, benchmarks and demos only (a loopback server harness, a local Kafka-protocol broker);
nothing in the library imports them."""
