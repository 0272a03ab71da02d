"""Shared test settings: small thread count, deterministic seeds, and a working directory
that is never the repository's (the commands' default folders, ``engines/``, ``export/`` and
``runs/``, are relative to it: a test must neither read what ``make demo`` left there nor
write there)."""

import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))

ROOT = Path(__file__).resolve().parents[1]
# the commands' default output folders, relative to the working directory
DEFAULT_FOLDERS = ("engines", "export", "runs")


def folder_listing(root: Path = ROOT) -> dict[str, tuple[int, int]]:
    """``{relative path: (size, mtime_ns)}`` of every file under ``root``'s default output
    folders (what ``make demo`` writes and what no test may change)."""
    listing = {}
    for name in DEFAULT_FOLDERS:
        for path in (root / name).rglob("*"):
            try:
                st = path.lstat()
            except OSError:  # removed while listing
                continue
            listing[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return listing


@pytest.fixture(scope="session", autouse=True)
def _session_cwd(tmp_path_factory):
    """Module- and session-scoped fixtures run in a temporary folder too."""
    before = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(before)


@pytest.fixture(autouse=True)
def _test_cwd(tmp_path, monkeypatch):
    """Every test runs with its own ``tmp_path`` as the working directory, and fails if the
    repository's ``engines/``, ``export/`` or ``runs/`` changed while it ran."""
    before = folder_listing()
    monkeypatch.chdir(tmp_path)
    yield
    after = folder_listing()
    if after != before:
        changed = sorted(set(after.items()) ^ set(before.items()))
        pytest.fail(f"the test changed the repository's {', '.join(DEFAULT_FOLDERS)}: "
                    f"{', '.join(sorted({p for p, _ in changed})[:5])} (tests must write "
                    "under tmp_path)", pytrace=False)


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


@pytest.fixture(params=["fastest", "pytorch"])
def backend(request):
    """Run the test with the fastest fake-quant kernels here and with the pure-PyTorch ones
    (the quantizer tests: tests/quant/)."""
    from trtqat.quant import _kernels

    before = _kernels._forced or None
    _kernels.set_backend(None if request.param == "fastest" else "pytorch")
    yield request.param
    _kernels.set_backend(before)
