"""A fake ``cuda`` package (cuda-python) for tests: see ``bindings/runtime.py``."""
