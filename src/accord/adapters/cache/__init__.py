"""adapters/cache."""
