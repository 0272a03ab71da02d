"""compare's ORT re-encoding checks an image classifier on the same inputs every run: the
training images without random augmentation (they made each build's verdict differ)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from trtqat.families.cnn.compare_data import image_data


def test_check_inputs_are_the_same_every_run():
    cfg = SimpleNamespace(data="digits", image_size=16, batch_sizes=(8,), calib_batches=2)
    runs = []
    for seed in (1, 2):
        torch.manual_seed(seed)  # the global RNG random crops and affines drew from
        runs.append(image_data(None, [], {}, cfg).calib)
    assert len(runs[0]) == 2 and runs[0][0].shape == (8, 3, 16, 16)
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
