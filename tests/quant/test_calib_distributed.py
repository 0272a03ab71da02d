"""sync_calibrators across two CPU processes (gloo), against one process on the union."""

from __future__ import annotations

import datetime
import functools
import socket
import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from trtqat.quant.calib import HistogramCalibrator, MaxCalibrator
from trtqat.quant.calib.distributed import sync_calibrators
from trtqat.quant.descriptor import QuantDescriptor
from trtqat.quant.model_ops import collect_stats, compute_amax
from trtqat.quant.tensor_quantizer import TensorQuantizer

WORLD = 2
HIST_METHODS = ("max", "percentile", "mse", "entropy")
ONLY = {4: 0, 5: 1}  # calibrator index -> the only rank that feeds it (6: no rank)


def make_cals():
    return [
        MaxCalibrator(),
        MaxCalibrator(axis=1),
        HistogramCalibrator(num_bins=512),
        HistogramCalibrator(axis=1, num_bins=256),
        HistogramCalibrator(axis=0, num_bins=256),  # data on rank 0 only
        MaxCalibrator(axis=2),  # data on rank 1 only
        HistogramCalibrator(num_bins=256),  # no data anywhere
    ]


def rank_batches(rank: int, round_: int) -> list[torch.Tensor]:
    """Different data on every rank; rank 1 has the wider range, round 1 widens it again."""
    g = torch.Generator().manual_seed(1000 * round_ + rank)
    scale = (1.0 + 2.0 * rank) * (1.0 + round_)
    return [torch.randn(16, 3, 400, generator=g) * scale,
            torch.randn(16, 3, 400, generator=g) ** 3 * scale * 0.5]


def feed(cals, batches, rank: int) -> None:
    for i, cal in enumerate(cals):
        if i == 6 or ONLY.get(i, rank) != rank:
            continue
        for b in batches:
            cal.collect(b)


def results(cals) -> list[dict | None]:
    out = []
    for cal in cals:
        if isinstance(cal, MaxCalibrator):
            amax = cal.compute_amax()
            out.append(None if amax is None else {"max": amax.clone()})
        elif cal.compute_amax("max") is None:
            out.append(None)
        else:
            res = {m: cal.compute_amax(m) for m in HIST_METHODS}
            res["hist"] = cal.hist.clone()
            out.append(res)
    return out


def make_model():
    return nn.Sequential(TensorQuantizer(QuantDescriptor(calib_method="histogram")),
                         TensorQuantizer(QuantDescriptor(axis=(1,))))


def model_amax(model) -> list[torch.Tensor]:
    compute_amax(model, "percentile", percentile=99.9)
    return [q.amax.clone() for q in model]


def _worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    try:
        cals = make_cals()
        feed(cals, rank_batches(rank, 0), rank)
        sync_calibrators(cals)
        first = results(cals)
        feed(cals, rank_batches(rank, 1), rank)  # more batches, then merge again
        sync_calibrators(cals)
        model = make_model()  # collect_stats merges across ranks by itself
        collect_stats(model, rank_batches(rank, 0), progress=False)
        torch.save({"r0": first, "r1": results(cals), "model": model_amax(model)},
                   f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def synced(tmp_path_factory):
    """Run both ranks once; {round: [rank0 results, rank1 results]}."""
    out = tmp_path_factory.mktemp("dist")
    # fork: the ranks inherit the imported modules (spawn re-imports torch: seconds per rank)
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, str(out)), daemon=True)
             for r in range(WORLD)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork of a threaded process
        for p in procs:
            p.start()
    for p in procs:
        p.join(timeout=120)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
            pytest.fail("a calibration rank did not finish within 120 s")
    assert [p.exitcode for p in procs] == [0] * WORLD, "a calibration rank failed"
    ranks = [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]
    return {key: [ranks[r][key] for r in range(WORLD)] for key in ("r0", "r1", "model")}


@functools.cache
def single_process(rounds: int):
    """One calibrator set fed with every rank's batches, rank by rank, round by round."""
    cals = make_cals()
    for rnd in range(rounds):
        for rank in range(WORLD):
            feed(cals, rank_batches(rank, rnd), rank)
    return results(cals)


@pytest.mark.parametrize("rnd", ["r0", "r1"])
def test_every_rank_ends_identical(synced, rnd):
    r0, r1 = synced[rnd]
    for a, b in zip(r0, r1):
        assert (a is None) == (b is None)
        if a is None:
            continue
        assert a.keys() == b.keys()
        for key in a:
            assert a[key].shape == b[key].shape
            assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("rnd,rounds", [("r0", 1), ("r1", 2)])
def test_max_is_exactly_the_union(synced, rnd, rounds):
    dist_res = synced[rnd][0]
    ref = single_process(rounds)
    for i in (0, 1, 5, 2, 3, 4):
        assert torch.equal(dist_res[i]["max"], ref[i]["max"]), i
    assert dist_res[1]["max"].shape == (1, 3, 1)
    assert dist_res[5]["max"].shape == (1, 1, 400)
    assert dist_res[4]["max"].shape == (16, 1, 1)
    assert dist_res[6] is None and ref[6] is None


@pytest.mark.parametrize("rnd,rounds", [("r0", 1), ("r1", 2)])
def test_histograms_close_to_the_union(synced, rnd, rounds):
    dist_res = synced[rnd][0]
    ref = single_process(rounds)
    for i in (2, 3, 4):
        d, s = dist_res[i], ref[i]
        # every element counted once, also after a second merge
        np.testing.assert_allclose(d["hist"].sum(-1).numpy(), s["hist"].sum(-1).numpy(),
                                   rtol=1e-9)
        cdf_d = d["hist"].cumsum(-1).numpy()
        cdf_s = s["hist"].cumsum(-1).numpy()
        assert np.abs(cdf_d - cdf_s).max() <= 0.02 * s["hist"].sum(-1).max().item()
        rng = s["max"].numpy()
        nb = d["hist"].shape[-1]
        np.testing.assert_allclose(d["percentile"].numpy(), s["percentile"].numpy(),
                                   rtol=0, atol=4 * rng.max() / nb)
        for m in ("mse", "entropy"):
            np.testing.assert_allclose(d[m].numpy(), s[m].numpy(), rtol=0, atol=0.15 * rng.max())


def test_collect_stats_merges_across_ranks(synced):
    r0, r1 = synced["model"]
    assert all(torch.equal(a, b) for a, b in zip(r0, r1))
    model = make_model()
    collect_stats(model, rank_batches(0, 0) + rank_batches(1, 0), progress=False)
    ref = model_amax(model)
    assert torch.equal(r0[1], ref[1])  # max calibrator: exact
    assert r0[0].shape == () and r0[1].shape == (1, 3, 1)
    assert float(r0[0]) == pytest.approx(float(ref[0]), abs=4 * float(ref[1].max()) / 2048)


def test_sync_without_process_group_is_a_noop():
    assert not dist.is_initialized()
    cals = make_cals()[:4]
    feed(cals, rank_batches(0, 0), 0)
    before = results(cals)
    sync_calibrators(cals)
    for a, b in zip(before, results(cals)):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
