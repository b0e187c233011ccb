"""adapters/telemetry."""
