"""Shared test settings: small thread count, deterministic seeds."""

import random

import numpy as np
import pytest
import torch

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))


@pytest.fixture(autouse=True)
def _seed():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture
def one_thread():
    """Run the test on one torch thread: on a small shared machine two OpenMP threads spin
    against each other. Directories whose tests are all compute-bound use it autouse."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
