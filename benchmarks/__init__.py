"""Measuring code (latency), run by DVC stages; its numbers are reported, never asserted by tests."""
