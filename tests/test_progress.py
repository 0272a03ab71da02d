"""Progress off a terminal: a plain line at the start, at most one per ``every_s`` seconds
of a fake clock, and one at the end (also when the loop breaks early); never a ``\\r``."""

from __future__ import annotations

import io

import pytest

from trtqat.progress import PlainProgress, progress


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _loop(items: int, step_s: float, *, stop: int | None = None, **kw):
    clock, out = Clock(), io.StringIO()
    bar = progress(range(items), total=items, desc="qat 1/2", stream=out, clock=clock, **kw)
    for i in bar:
        if stop is not None and i >= stop:
            break
        clock.t += step_s
        bar.set_postfix(loss="0.1234")
    del bar
    return out.getvalue().splitlines()


def test_plain_lines_at_start_every_30s_and_end() -> None:
    lines = _loop(400, 0.5)  # 200 s: a line at 30, 60, ... 180 s
    assert lines[0] == "qat 1/2: 0/400 batches"
    assert len(lines) == 1 + 6 + 1, lines
    assert lines[1].startswith("qat 1/2: 60/400 batches, 2.0 it/s, eta 2m50s")
    assert lines[1].endswith("loss 0.1234")
    assert lines[-1] == "qat 1/2: 400/400 batches in 3m20s, 2.0 it/s, loss 0.1234"
    assert not any("\r" in line for line in lines)


@pytest.mark.parametrize("stop", [None, 3])
def test_a_short_or_broken_loop_still_says_start_and_end(stop) -> None:
    lines = _loop(10, 0.1, stop=stop)
    assert len(lines) == 2 and lines[0].endswith("0/10 batches")
    assert lines[1].startswith(f"qat 1/2: {stop or 10}/10 batches in ")


def test_a_brief_loop_speaks_only_when_long() -> None:
    assert _loop(10, 1.0, brief=True) == []
    lines = _loop(10, 4.0, brief=True)  # 40 s: one line at 32 s, and the end
    assert [line.split(",")[0] for line in lines] == ["qat 1/2: 8/10 batches",
                                                      "qat 1/2: 10/10 batches in 40s"]


def test_disabled_is_silent_and_update_form_counts() -> None:
    assert _loop(50, 10.0, enabled=False) == []
    clock, out = Clock(), io.StringIO()
    bar = PlainProgress(total=None, desc="sensitivity", unit="layers", stream=out, clock=clock)
    clock.t += 31
    bar.update(5)
    bar.close()
    bar.close()
    assert out.getvalue().splitlines() == [
        "sensitivity: 0 layers", "sensitivity: 5 layers, 0.2 it/s",
        "sensitivity: 5 layers in 31s, 0.2 it/s"]


def test_a_terminal_gets_a_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(out, "isatty", lambda: True)
    bar = progress(range(3), total=3, desc="x", stream=out)
    assert not isinstance(bar, PlainProgress) and list(bar) == [0, 1, 2]


def test_calibration_counts_its_last_batch(capsys: pytest.CaptureFixture) -> None:
    import torch
    from torch import nn

    import trtqat

    model = trtqat.quantize(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()))
    trtqat.collect_stats(model, [torch.randn(2, 3, 8, 8) for _ in range(5)], num_batches=2)
    assert capsys.readouterr().err.splitlines()[-1].startswith("calibrate: 2/2 batches in ")
