"""Benchmarks: `python -m bench` (see bench/__main__.py)."""
