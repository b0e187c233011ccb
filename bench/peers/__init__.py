"""Peer systems on the reference workload, each run in its own virtual environment."""
