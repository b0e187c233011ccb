"""adapters/stores."""
