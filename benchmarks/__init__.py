"""Benchmarks (run as modules from the repository root, e.g. ``python -m benchmarks.assignor``)."""
