"""Benchmarks that print figures; run them directly, never as tests."""
