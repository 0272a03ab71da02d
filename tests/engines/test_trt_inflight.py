"""trtexec's run model on the fake TensorRT: two queries in flight, --useSpinWait, --device."""

from __future__ import annotations

import pytest

from trtqat.engines import BenchmarkSettings, CudaError, OptionsError, build_engine
from trtqat.engines.cuda import load_cuda
from trtqat.engines.timing import QueryTimes, measure_pipelined

from .test_trt_backend import PROFILE, calls, x_of

SETTINGS = BenchmarkSettings(warmup_ms=0, duration_s=0, iterations=6, cuda_graph=False,
                             data_transfers=True)


def test_measure_pipelined_keeps_depth_in_flight_and_drains() -> None:
    in_flight, peak, submitted = [], [0], [0]

    def submit() -> None:
        submitted[0] += 1
        in_flight.append(float(submitted[0]))
        peak[0] = max(peak[0], len(in_flight))

    def collect() -> QueryTimes:
        t = in_flight.pop(0)
        return QueryTimes(t, t, t, t, t, t + 1, t + 1, t + 1)

    counted, warmups = measure_pipelined(submit, collect, 2, SETTINGS, clock=lambda: 0.0)
    assert peak[0] == 2 and not in_flight  # two in flight, nothing left behind
    assert warmups == 0 and len(counted) == submitted[0] >= SETTINGS.iterations


def test_tensorrt_enqueues_the_next_query_before_waiting(fake_trt, fake_cuda,
                                                         dynamic_onnx) -> None:
    engine = build_engine(dynamic_onnx, "tensorrt", **PROFILE)
    with engine.runner() as runner:
        assert runner.inflight_depth == 2
        enqueued_at_wait = []
        wait = runner.cuda.wait_event

        def spy(event, spin=False):
            enqueued_at_wait.append(calls(fake_trt).count("IExecutionContext.execute_async_v3"))
            return wait(event, spin)

        runner.cuda.wait_event = spy
        before = calls(fake_trt).count("IExecutionContext.execute_async_v3")
        result = runner.benchmark(x_of(2), SETTINGS)
    waits = [n - before for n in enqueued_at_wait]
    assert waits[0] == 2  # the second query is enqueued before the first is waited for
    assert waits[:4] == [2, 3, 4, 5]
    assert waits[-1] == waits[-2] == len(result.queries)  # the last two drained
    starts = [q.h2d_start for q in result.queries]
    assert starts == sorted(starts)


def test_spin_wait_polls_events(fake_trt, fake_cuda, dynamic_onnx) -> None:
    engine = build_engine(dynamic_onnx, "tensorrt", **PROFILE)
    with engine.runner(spin_wait=True) as runner:
        fake_cuda._STATE.calls.clear()
        runner.benchmark(x_of(2), SETTINGS)
    made = fake_cuda._STATE.calls
    assert made.count("cudaEventQuery") >= SETTINGS.iterations
    assert made.count("cudaEventSynchronize") == 1  # only the timing base
    with engine.runner() as runner:
        fake_cuda._STATE.calls.clear()
        runner.benchmark(x_of(2), SETTINGS)
    assert "cudaEventQuery" not in fake_cuda._STATE.calls


def test_device_selects_and_is_checked(fake_trt, fake_cuda, dynamic_onnx) -> None:
    fake_cuda._reset(devices=2)
    assert load_cuda("cuda-python", device=1) is not None
    assert fake_cuda._STATE.device == 1 and "cudaSetDevice" in fake_cuda._STATE.calls
    with pytest.raises(CudaError, match=r"--device=2: this machine has 2 CUDA device\(s\); "
                                        r"use --device=0..1"):
        load_cuda("cuda-python", device=2)
    engine = build_engine(dynamic_onnx, "tensorrt", **PROFILE)
    with engine.runner(device=1) as runner:
        runner.infer(x_of(1))
    assert fake_cuda._STATE.device == 1


def test_inf_streams_round_robin_over_own_contexts(fake_trt, fake_cuda, dynamic_onnx) -> None:
    engine = build_engine(dynamic_onnx, "tensorrt", **PROFILE)
    with engine.runner(streams=2) as runner:
        assert runner.inflight_depth == 4
        start = len(fake_trt._calls)
        result = runner.benchmark(x_of(2), SETTINGS)
        assert runner._lanes == [runner]  # the extra stream's runner is gone again
    new = fake_trt._calls[start:]
    handles = [args[0] for name, args in new if name == "IExecutionContext.execute_async_v3"]
    assert len(set(handles)) == 2 and handles[:4] == [handles[0], handles[1]] * 2
    assert [n for n, _ in new].count("ICudaEngine.create_execution_context") == 1
    assert len(result.queries) == len(handles) >= SETTINGS.iterations
    assert not fake_cuda._STATE.streams  # every stream destroyed
    with pytest.raises(OptionsError, match="--infStreams must be an int >= 1"):
        engine.runner(streams=0)
