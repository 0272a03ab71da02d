"""Every test here runs on one thread (``one_thread`` in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Torch on one thread: the tests' timings and results do not depend on the machine."""
