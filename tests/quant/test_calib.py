"""Calibrators against independent numpy/scipy references (loops are fine here)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import rel_entr

from trtqat.errors import CalibrationError, QuantConfigError
from trtqat.quant.calib import HistogramCalibrator, MaxCalibrator
from trtqat.quant.calib.histogram import amax_from_histogram, rebin_histogram

METHODS = ("max", "percentile", "mse", "entropy")


# ----------------------------------------------------------------------------- references
def ref_hist(absx: np.ndarray, num_bins: int, rng: float) -> np.ndarray:
    """Counts of |x| over [0, rng] (numpy, float64 binning)."""
    if rng == 0:
        h = np.zeros(num_bins)
        h[0] = absx.size
        return h
    return np.histogram(absx, bins=num_bins, range=(0.0, rng))[0].astype(np.float64)


def ref_percentile(hist, edges, percentile):
    total, c = hist.sum(), 0.0
    for k in range(len(hist)):
        c += hist[k]
        if c >= percentile / 100.0 * total:
            return edges[k + 1]
    return edges[-1]


def ref_mse_curve(hist, edges, num_bits, unsigned, start_bin, stride):
    """(candidate edge indices, count-weighted squared fake-quant error of the bin centres)."""
    qmax = 2 ** (num_bits - 1 + int(unsigned)) - 1
    centres = (edges[:-1] + edges[1:]) / 2
    args, errs = [], []
    for i in range(start_bin, len(hist) + 1, stride):
        amax = edges[i]
        q = np.clip(np.round(centres / amax * qmax), 0, qmax) * amax / qmax
        errs.append(float(np.sum(hist * (centres - q) ** 2)))
        args.append(i)
    return np.array(args), np.array(errs)


def ref_mse(hist, edges, num_bits, unsigned, start_bin, stride):
    if edges[-1] == 0:
        return 0.0
    args, errs = ref_mse_curve(hist, edges, num_bits, unsigned, start_bin, stride)
    return edges[args[int(np.argmin(errs))]]  # first minimum


def kl(p, q):
    """scipy.stats.entropy(p, q): both normalised, sum of p log(p / q)."""
    with np.errstate(all="ignore"):
        d = float(np.sum(rel_entr(p / p.sum(), q / q.sum())))
    return np.inf if np.isnan(d) else d


def ref_entropy_curve(hist, num_bits, unsigned, start_bin, stride):
    """pytorch-quantization's _compute_amax_entropy divergences (NaN read as +inf)."""
    bins = hist.astype(np.float64).copy()
    bins[0] = bins[1]
    levels = 1 << (num_bits - 1 + int(unsigned))
    divs, args = [], []
    for i in range(start_bin, len(bins) + 1, stride):
        space = np.linspace(0, i, num=levels + 1)
        dig = np.digitize(np.arange(i), space) - 1
        dig[bins[:i] == 0] = -1
        keep = dig != -1
        sums = np.bincount(dig[keep], weights=bins[:i][keep], minlength=levels)
        counts = np.bincount(dig[keep], minlength=levels)
        q = np.zeros(i)
        q[keep] = sums[dig[keep]] / counts[dig[keep]]
        p = bins[:i].copy()
        p[-1] += bins[i:].sum()
        divs.append(kl(p, q))
        args.append(i)
    return np.array(args), np.array(divs)


def ref_entropy(hist, edges, num_bits, unsigned, start_bin, stride):
    if edges[-1] == 0:
        return 0.0
    args, divs = ref_entropy_curve(hist, num_bits, unsigned, start_bin, stride)
    last = len(divs) - 1 - int(np.argmin(divs[::-1]))  # last minimum
    return edges[args[last]]


def reference_amax(absx: np.ndarray, method: str, num_bins: int, *, num_bits=8, unsigned=False,
                   start_bin=128, stride=1, percentile=99.99) -> float:
    """Per-tensor reference: exact max, histogram over [0, max], then the method."""
    rng = float(absx.max())
    if method == "max":
        return rng
    hist = ref_hist(absx, num_bins, rng)
    edges = np.linspace(0.0, rng, num_bins + 1)
    if method == "percentile":
        return ref_percentile(hist, edges, percentile)
    if method == "mse":
        return ref_mse(hist, edges, num_bits, unsigned, start_bin, stride)
    return ref_entropy(hist, edges, num_bits, unsigned, start_bin, stride)


# ----------------------------------------------------------------------------- data
def make_data(kind: str, shape, seed: int = 0) -> torch.Tensor:
    g = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if kind == "normal":
        x = g.normal(0, 1, n)
    elif kind == "laplace":
        x = g.laplace(0, 0.5, n)
    elif kind == "outliers":
        x = g.normal(0, 1, n)
        x[g.choice(n, 20, replace=False)] = g.uniform(-40, 40, 20)
    elif kind == "negative":
        x = -np.abs(g.normal(2, 1, n)) - 0.1
    elif kind == "relu":
        x = np.maximum(g.normal(0, 1, n), 0)
    elif kind == "zero":
        x = np.zeros(n)
    else:
        raise ValueError(kind)
    return torch.from_numpy(x.reshape(shape).astype(np.float32))


def bin_width(absx: np.ndarray, num_bins: int) -> float:
    return float(absx.max()) / num_bins


def calib(x_batches, method, **kw) -> torch.Tensor:
    ctor = {k: kw.pop(k) for k in ("num_bits", "axis", "unsigned", "num_bins", "skip_zeros")
            if k in kw}
    c = HistogramCalibrator(**ctor)
    for x in x_batches:
        c.collect(x)
    return c.compute_amax(method, **kw) if method != "max" else c.compute_amax("max")


# ----------------------------------------------------------------------------- per tensor
@pytest.mark.parametrize("kind", ["normal", "laplace", "outliers", "negative", "zero"])
@pytest.mark.parametrize("method", METHODS)
def test_per_tensor_matches_reference(kind, method):
    num_bins = 512
    x = make_data(kind, (64, 500), seed=1)
    absx = x.abs().numpy().astype(np.float64)
    got = calib([x], method, num_bins=num_bins)
    assert got.dtype == torch.float32 and got.shape == ()
    ref = reference_amax(absx, method, num_bins)
    # the same bin edge (binning in float32 vs float64 could only move values on an edge)
    tol = 1e-6 * ref + (0.25 * bin_width(absx, num_bins) if method != "max" else 0)
    assert abs(float(got) - ref) <= tol, (float(got), ref)
    if kind == "zero":
        assert float(got) == 0.0


@pytest.mark.parametrize("method", ["percentile", "mse", "entropy"])
def test_default_bins_and_options_match_reference(method):
    x = make_data("laplace", (50_000,), seed=2)
    absx = x.abs().numpy().astype(np.float64)
    kw = {"percentile": 99.9} if method == "percentile" else {"start_bin": 200, "stride": 3}
    got = calib([x], method, **kw)
    ref = reference_amax(absx, method, 2048, **kw)
    assert abs(float(got) - ref) <= 0.25 * bin_width(absx, 2048) + 1e-6 * ref


@pytest.mark.parametrize("num_bits,unsigned", [(8, True), (4, False), (6, True)])
@pytest.mark.parametrize("method", ["mse", "entropy"])
def test_bits_and_unsigned_match_reference(num_bits, unsigned, method):
    x = make_data("relu", (40_000,), seed=3)
    absx = x.abs().numpy().astype(np.float64)
    got = calib([x], method, num_bits=num_bits, unsigned=unsigned, num_bins=512)
    ref = reference_amax(absx, method, 512, num_bits=num_bits, unsigned=unsigned)
    assert abs(float(got) - ref) <= 0.25 * bin_width(absx, 512) + 1e-6 * ref


@pytest.mark.parametrize("kind", ["normal", "outliers", "relu", "laplace"])
@pytest.mark.parametrize("method", ["percentile", "mse", "entropy"])
def test_amax_from_identical_histogram_is_exact(kind, method):
    """Given the very same histogram, the selection equals the reference exactly."""
    num_bins = 512
    absx = make_data(kind, (30_000,), seed=4).abs().numpy().astype(np.float64)
    rng = float(np.float32(absx.max()))
    hist = ref_hist(absx, num_bins, rng)
    edges = np.linspace(0.0, rng, num_bins + 1)
    ref = {"percentile": lambda: ref_percentile(hist, edges, 99.9),
           "mse": lambda: ref_mse(hist, edges, 8, False, 64, 1),
           "entropy": lambda: ref_entropy(hist, edges, 8, False, 128, 1)}[method]()
    kw = {"percentile": 99.9} if method == "percentile" else {
        "start_bin": 64 if method == "mse" else 128}
    got = amax_from_histogram(torch.from_numpy(hist), torch.tensor(rng), method, **kw)
    assert float(got) == pytest.approx(ref, rel=1e-6)


def test_entropy_sparse_histogram_uses_full_range():
    # a single occupied bin: every smaller candidate cannot represent the data (inf), so the
    # threshold is the full range, as is a histogram with nothing but zeros
    hist = torch.zeros(256, dtype=torch.float64)
    hist[-1] = 10
    assert float(amax_from_histogram(hist, torch.tensor(3.0), "entropy")) == 3.0
    hist = torch.zeros(256, dtype=torch.float64)
    hist[0] = 10
    assert float(amax_from_histogram(hist, torch.tensor(3.0), "entropy")) == 3.0


# ----------------------------------------------------------------------------- per channel
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("layout", ["activation", "weight"])
def test_per_channel_equals_per_tensor_reference_per_channel(method, layout):
    num_bins = 512
    if layout == "activation":  # (N, C, H, W), axis=1, channels of different scale
        x = make_data("normal", (8, 5, 12, 12), seed=5)
        x = x * torch.tensor([1.0, 3.0, 0.2, 0.0, 1.0]).view(1, 5, 1, 1)
        x[0, 4, 0, 0] = 25.0  # an outlier channel
        axis, kept = 1, 1
    else:  # (K, C), axis=0, Laplace rows
        x = make_data("laplace", (6, 400), seed=6) * torch.linspace(0.5, 2, 6).view(6, 1)
        axis, kept = 0, 0
    got = calib([x], method, axis=axis, num_bins=num_bins)
    expect_shape = [1] * x.dim()
    expect_shape[kept] = x.shape[kept]
    assert got.shape == tuple(expect_shape) and got.dtype == torch.float32
    got = got.reshape(-1)
    for ch in range(x.shape[kept]):
        absx = x.select(kept, ch).abs().numpy().astype(np.float64).ravel()
        ref = reference_amax(absx, method, num_bins)
        tol = 1e-6 * ref + (0.25 * bin_width(absx, num_bins) if method != "max" else 0)
        assert abs(float(got[ch]) - ref) <= tol, (ch, float(got[ch]), ref)


def test_per_channel_multiple_axes_and_negative_axis():
    x = make_data("normal", (3, 4, 5, 6), seed=7)
    c = HistogramCalibrator(axis=(0, -1), num_bins=256)
    c.collect(x)
    amax = c.compute_amax("percentile", percentile=100)
    assert amax.shape == (3, 1, 1, 6)
    assert c.hist.shape == (3, 1, 1, 6, 256)
    assert c.bin_edges.shape == (3, 1, 1, 6, 257)
    np.testing.assert_array_equal(c.compute_amax("max").numpy(),
                                  x.abs().amax(dim=(1, 2), keepdim=True).numpy())
    np.testing.assert_array_equal(c.bin_edges[..., -1].numpy(), c.compute_amax("max").numpy())
    # percentile 100 ends at the edge after the last occupied bin: the max
    np.testing.assert_allclose(amax.numpy(), c.compute_amax("max").numpy(), rtol=1e-6)


# ----------------------------------------------------------------------------- batches
def test_batches_without_growth_are_exact():
    """While the range does not grow, the histogram equals numpy's over the union."""
    batches = [make_data("normal", (4000,), seed=s) * (1.0 if s == 0 else 0.5) for s in range(4)]
    batches[0][0] = 6.0  # the first batch holds the max
    c = HistogramCalibrator(num_bins=256)
    for b in batches:
        c.collect(b)
    union = torch.cat(batches).abs().numpy().astype(np.float64)
    ref = ref_hist(union, 256, 6.0)
    np.testing.assert_allclose(c.hist.numpy(), ref, atol=2)  # edge rounding only
    assert c.hist.sum().item() == union.size
    assert float(c.compute_amax("max")) == 6.0


@pytest.mark.parametrize("axis", [None, 1])
def test_range_growth_rebins_close_to_union(axis):
    """Growing batches: re-binned counts stay close to the exact histogram of the union."""
    num_bins = 512
    batches = [make_data("laplace", (16, 3, 200), seed=s) * (1 + s) for s in range(5)]
    c = HistogramCalibrator(axis=axis, num_bins=num_bins)
    for b in batches:
        c.collect(b)
    union = torch.cat(batches)
    chans = [union] if axis is None else [union[:, k] for k in range(3)]
    hist = c.hist.reshape(len(chans), num_bins).numpy()
    got = {m: c.compute_amax(m).reshape(-1) for m in METHODS}
    for k, ux in enumerate(chans):
        absx = ux.abs().numpy().astype(np.float64).ravel()
        width = bin_width(absx, num_bins)
        assert hist[k].sum() == pytest.approx(absx.size)
        # cumulative counts differ by at most about one old bin per growth step
        cdf_err = np.abs(np.cumsum(hist[k]) - np.cumsum(ref_hist(absx, num_bins, absx.max())))
        assert cdf_err.max() <= 0.01 * absx.size
        assert float(got["max"][k]) == pytest.approx(absx.max(), rel=1e-7)
        assert float(got["percentile"][k]) == pytest.approx(
            reference_amax(absx, "percentile", num_bins), abs=4 * width)
        # MSE and entropy surfaces are flat near their optimum, so a small change of the
        # counts can move the argmin a lot: check instead that the chosen range is (near)
        # optimal for the exact histogram of the union.
        exact = ref_hist(absx, num_bins, absx.max())
        edges = np.linspace(0.0, absx.max(), num_bins + 1)
        args, errs = ref_mse_curve(exact, edges, 8, False, 128, 1)
        pick = int(round(float(got["mse"][k]) / width))
        assert errs[args == pick][0] <= 1.05 * errs.min()
        args, divs = ref_entropy_curve(exact, 8, False, 128, 1)
        pick = int(round(float(got["entropy"][k]) / width))
        assert divs[args == pick][0] <= 1.25 * divs.min()


def test_rebin_histogram_properties():
    g = torch.Generator().manual_seed(0)
    hist = torch.rand(3, 64, generator=g, dtype=torch.float64) * 100
    old = torch.tensor([1.0, 2.0, 0.0])
    same = rebin_histogram(hist, old, old)
    np.testing.assert_array_equal(same[:2].numpy(), hist[:2].numpy())
    new = torch.tensor([2.0, 3.0, 5.0])
    out = rebin_histogram(hist, old, new)
    np.testing.assert_allclose(out.sum(1).numpy(), hist.sum(1).numpy(), rtol=1e-12)
    # doubling the range merges pairs of bins exactly
    np.testing.assert_allclose(out[0, :32].numpy(), hist[0].view(32, 2).sum(1).numpy(),
                               rtol=1e-12)
    assert out[0, 32:].abs().max() == 0
    # a zero range holds everything at 0, which stays in bin 0
    assert out[2, 0] == hist[2].sum()


def test_large_batches_are_histogrammed_in_chunks(monkeypatch):
    import trtqat.quant.calib.histogram as hmod

    x = make_data("normal", (5000,), seed=11)
    whole = HistogramCalibrator(num_bins=128)
    whole.collect(x)
    monkeypatch.setattr(hmod, "_HISTC_CHUNK", 999)
    chunked = HistogramCalibrator(num_bins=128)
    chunked.collect(x)
    np.testing.assert_array_equal(chunked.hist.numpy(), whole.hist.numpy())


def test_skip_zeros():
    x = make_data("relu", (20_000,), seed=8)
    c = HistogramCalibrator(num_bins=256, skip_zeros=True)
    c.collect(x)
    nz = x[x != 0].numpy().astype(np.float64)
    np.testing.assert_allclose(c.hist.numpy(), ref_hist(nz, 256, nz.max()), atol=2)
    assert float(c.compute_amax("percentile", percentile=99)) == pytest.approx(
        reference_amax(nz, "percentile", 256, percentile=99), abs=nz.max() / 256)
    cc = HistogramCalibrator(axis=0, num_bins=256, skip_zeros=True)
    cc.collect(x.view(4, -1))
    assert cc.hist.sum().item() == (x != 0).sum().item()


def test_dtypes_devices_and_reset():
    x = make_data("normal", (1000,), seed=9)
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        c = HistogramCalibrator(num_bins=128)
        c.collect(x.to(dtype))
        assert c.compute_amax("percentile").dtype == torch.float32
        assert float(c.compute_amax("max")) == float(x.to(dtype).abs().max().float())
    c.reset()
    assert c.hist is None and c.compute_amax("entropy") is None
    c.collect(torch.empty(0))
    assert c.compute_amax("mse") is None


def test_errors():
    c = HistogramCalibrator()
    assert c.compute_amax("percentile") is None  # empty calibrator
    with pytest.raises(CalibrationError, match="max, percentile, mse, entropy"):
        c.compute_amax("median")
    c.collect(torch.randn(100))
    for bad in (0, -1, 100.5, "99"):
        with pytest.raises(CalibrationError, match="percentile="):
            c.compute_amax("percentile", percentile=bad)
    with pytest.raises(CalibrationError, match="start_bin"):
        c.compute_amax("mse", start_bin=5000)
    with pytest.raises(CalibrationError, match="stride"):
        c.compute_amax("entropy", stride=0)
    with pytest.raises(CalibrationError, match="num_bins >= 256"):
        d = HistogramCalibrator(num_bins=128, unsigned=True)
        d.collect(torch.rand(10))
        d.compute_amax("entropy")
    with pytest.raises(QuantConfigError, match="num_bins"):
        HistogramCalibrator(num_bins=1)
    HistogramCalibrator(grow_method="append")  # deprecated and ignored, as in pytorch-quantization
    with pytest.raises(CalibrationError, match="NaN or inf"):
        c.collect(torch.tensor([1.0, float("nan")]))
    with pytest.raises(CalibrationError, match="NaN or inf"):
        HistogramCalibrator(axis=0).collect(torch.tensor([[1.0], [float("inf")]]))
    p = HistogramCalibrator(axis=1)
    p.collect(torch.randn(2, 3))
    with pytest.raises(CalibrationError, match="per-channel shape"):
        p.collect(torch.randn(2, 4))
    with pytest.raises(QuantConfigError, match="axis"):
        HistogramCalibrator(axis=3).collect(torch.randn(2, 3))


def test_tensor_quantizer_loads_histogram_amax():
    from trtqat.quant.descriptor import QuantDescriptor
    from trtqat.quant.tensor_quantizer import TensorQuantizer

    q = TensorQuantizer(QuantDescriptor(calib_method="histogram"))
    q.disable_quant()
    q.enable_calib()
    x = make_data("normal", (20_000,), seed=10)
    q(x)
    q.load_calib_amax("percentile", percentile=99.9)
    absx = x.abs().numpy().astype(np.float64)
    assert float(q.amax) == pytest.approx(
        reference_amax(absx, "percentile", 2048, percentile=99.9), abs=bin_width(absx, 2048))
    q.load_calib_amax("entropy")
    assert 0 < float(q.amax) <= absx.max()


# ----------------------------------------------------------------------------- max
@pytest.mark.parametrize("axis", [None, 0, (1,), (0, 2)])
def test_max_calibrator_over_batches(axis):
    batches = [make_data("laplace", (4, 3, 5), seed=s) * (s + 1) for s in range(3)]
    c = MaxCalibrator(axis=axis, track_amax=True)
    assert c.compute_amax() is None
    for b in batches:
        c.collect(b)
    if axis is None:
        ref = max(np.abs(b.numpy()).max() for b in batches)
    else:
        kept = {a % 3 for a in ((axis,) if isinstance(axis, int) else axis)}
        reduced = tuple(d for d in range(3) if d not in kept)
        ref = np.maximum.reduce([np.abs(b.numpy()).max(axis=reduced, keepdims=True)
                                 for b in batches])
    amax = c.compute_amax()
    assert amax.dtype == torch.float32 and amax.shape == np.shape(ref)
    np.testing.assert_array_equal(amax.numpy(), ref)
    assert len(c.amaxs) == 3
    c.reset()
    assert c.compute_amax() is None and c.amaxs == []
