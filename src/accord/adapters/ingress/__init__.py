"""adapters/ingress."""
