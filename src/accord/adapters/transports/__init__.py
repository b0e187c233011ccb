"""adapters/transports."""
