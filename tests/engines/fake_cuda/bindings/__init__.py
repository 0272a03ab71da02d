"""A fake ``cuda.bindings``."""
