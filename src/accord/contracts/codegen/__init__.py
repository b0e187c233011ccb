"""contracts/codegen."""
