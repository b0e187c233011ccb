"""Accord: governed contracts, compiled workflows and a durable engine for worker fleets."""

from accord.errors import AccordError

__all__ = ["AccordError", "__version__"]

__version__ = "0.1.0"
