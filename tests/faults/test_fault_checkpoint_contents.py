"""What a checkpoint holds never decides where files go or which code runs: names read from
it stay inside --out, a changed model file is not imported, a NaN checkpoint is not
analysed, and a damaged metrics.jsonl is one line on --resume."""

from __future__ import annotations

import json

import pytest
import torch
from faultlib import one_error_line, run_cli
from test_fault_disk_full import CALIBRATE, NET
from tiny import train_argv

from trtqat.cli import main as trtqat_main
from trtqat.runs.checkpoint import load_checkpoint


@pytest.fixture
def ptq(tmp_path, capsys):
    """A PTQ run of a model from a file (its source records the file and its SHA-256)."""
    src = tmp_path / "src" / "net.py"
    src.parent.mkdir()
    src.write_text(NET)
    out = tmp_path / "ptq"
    rc, err = run_cli(capsys, ["calibrate", "--model", f"{src}:make", *CALIBRATE,
                               "--out", str(out)])
    assert rc == 0, err
    return out, src


def _edit(path, change) -> None:
    ckpt = torch.load(path, weights_only=True)
    change(ckpt)
    torch.save(ckpt, path)


@pytest.mark.parametrize("field, value", [
    ("method", "../../../../X"), ("method", "/tmp/abs"), ("percentile", "../../y"),
    ("stage", "../../z"),
])
def test_names_from_a_checkpoint_stay_inside_out(ptq, tmp_path, capsys, field, value):
    run, _ = ptq
    best = run / "best.pt"

    def change(ckpt):
        if field == "stage":
            ckpt["stage"] = value
        else:
            ckpt["calib"].update(method="percentile" if field == "percentile" else value,
                                 **({field: value} if field == "percentile" else {}))

    _edit(best, change)
    out = tmp_path / "a" / "b" / "c" / "export"
    before = {p for p in tmp_path.rglob("*") if p.is_file()}
    run_cli(capsys, ["export", "-c", str(best), "--variant", "fp32", "--out", str(out),
                     "--val-batches", "1"])
    new = {p for p in tmp_path.rglob("*") if p.is_file()} - before
    assert new, "nothing exported"
    assert all(p.parent == out for p in new), sorted(map(str, new))


def test_a_changed_model_file_is_not_imported_without_trust(ptq, tmp_path, capsys):
    run, src = ptq
    marker = tmp_path / "imported"
    src.write_text(NET + f"\nopen({str(marker)!r}, 'w').write('ran')\n")
    out = tmp_path / "export"
    argv = ["export", "-c", str(run / "best.pt"), "--variant", "fp32", "--out", str(out),
            "--val-batches", "1"]
    rc, err = run_cli(capsys, argv)
    one_error_line(rc, err, f"importing {src}, which changed since the checkpoint was "
                            "written (its SHA-256 differs)")
    assert "--trust-model-file" in err[0]
    assert not marker.exists() and not out.exists()
    for command in (["qat", "-c", str(run / "best.pt"), "--epochs", "1", "--data", "synthetic",
                     "--image-size", "16", "--limit-batches", "1", "--no-progress"],
                    ["sensitivity", "-c", str(run / "best.pt")],
                    ["compare", "--run", str(run)]):
        rc, err = run_cli(capsys, command + ["--out", str(tmp_path / "o")])
        one_error_line(rc, err, "SHA-256 differs")
        assert not marker.exists()
    rc, err = run_cli(capsys, [*argv, "--trust-model-file"])
    assert rc == 0, err
    assert marker.read_text() == "ran"


def test_a_checkpoint_that_names_another_file_is_not_imported(ptq, tmp_path, capsys):
    run, src = ptq
    other = tmp_path / "other.py"
    other.write_text(NET + f"\nopen({str(tmp_path / 'imported')!r}, 'w').write('ran')\n")

    def change(ckpt):  # the recorded file and hash are the good ones, the source is not
        ckpt["model"]["source"]["model"] = f"{other}:make"

    _edit(run / "best.pt", change)
    rc, err = run_cli(capsys, ["export", "-c", str(run / "best.pt"), "--variant", "fp32",
                               "--out", str(tmp_path / "export")])
    one_error_line(rc, err, f"importing {other}, which is not recorded with its SHA-256")
    assert not (tmp_path / "imported").exists()


def test_sensitivity_refuses_a_nan_checkpoint(ptq, tmp_path, capsys):
    run, _ = ptq

    def poison(ckpt):
        ckpt["state_dict"]["0.weight"].fill_(float("nan"))

    _edit(run / "best.pt", poison)
    out = tmp_path / "sens"
    rc, err = run_cli(capsys, ["sensitivity", "-c", str(run / "best.pt"), "--out", str(out)])
    one_error_line(rc, err, "is not finite: '0.weight' holds 108 of 108 non-finite values")
    assert not out.exists()


@pytest.mark.parametrize("line", ['[1, 2]', '"text"', '3', '{"stage": "fp32", "epoch": "x"}',
                                  'null'])
def test_a_metrics_line_that_is_not_a_record_is_one_line_on_resume(tmp_path, capsys, tiny,
                                                                   line):
    out = tmp_path / "run"
    assert run_cli(capsys, train_argv(out, "--stop-after", "1", epochs=2))[0] == 0
    metrics = out / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + line + "\n")
    rc, err = run_cli(capsys, train_argv(out, "--resume", epochs=2))
    one_error_line(rc, err, "metrics.jsonl line 2 is not a metrics record")
    assert load_checkpoint(out / "last.pt")["epoch"] == 1
    assert json.loads(metrics.read_text().splitlines()[0])["epoch"] == 1


def test_off_a_terminal_progress_is_one_line_per_epoch(tmp_path, capsys, tiny):
    argv = [a for a in train_argv(tmp_path / "run", epochs=2) if a != "--no-progress"]
    capsys.readouterr()
    rc = trtqat_main(argv)
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "\r" not in out + err  # no progress-bar redraws in a log file
    epochs = [line for line in out.splitlines() if line.startswith("fp32 epoch ")]
    assert [line.split()[2] for line in epochs] == ["1/2:", "2/2:"]


def test_export_compare_and_sensitivity_replace_only_their_own_outputs(ptq, tmp_path, capsys):
    run, _ = ptq
    out = tmp_path / "out"
    out.mkdir()
    planted = {"net.make-ptq-max-fp32.onnx": "my notes, not a model\n",
               "export.json": '{"Layers": [], "Bindings": []}\n',
               "report.json": '{"checkpoint": "x", "variant": "all", "results": []}\n',
               "sensitivity.json": '{"backend": "ort", "variants": [], "metric": "top1"}\n'}
    for name, text in planted.items():
        (out / name).write_text(text)
    for argv in (["export", "-c", str(run), "--variant", "fp32", "--out", str(out)],
                 ["compare", "--run", str(run.parent), "--out", str(out), "--export-dir",
                  str(tmp_path / "x")],
                 ["sensitivity", "-c", str(run), "--out", str(out)]):
        rc, err = run_cli(capsys, argv)
        one_error_line(rc, err, "exists and is not ")
        assert {p.name: p.read_text() for p in out.iterdir()} == planted
    (out / "net.make-ptq-max-fp32.onnx").unlink()
    (out / "export.json").unlink()
    rc, err = run_cli(capsys, ["export", "-c", str(run), "--variant", "fp32", "--out", str(out),
                               "--val-batches", "1"])
    assert rc == 0, err
    for _ in range(2):  # its own earlier outputs are replaced
        assert run_cli(capsys, ["export", "-c", str(run), "--variant", "fp32", "--out",
                                str(out), "--val-batches", "1"])[0] == 0


@pytest.mark.parametrize("command", ["export", "sensitivity", "qat"])
def test_a_negative_amax_is_named_with_its_value(ptq, tmp_path, capsys, command):
    run, _ = ptq

    def negative(ckpt):
        ckpt["state_dict"]["0._input_quantizer._amax"].fill_(-3.2)

    _edit(run / "best.pt", negative)
    out = tmp_path / "out"
    extra = ["--data", "synthetic", "--image-size", "16"] if command == "qat" else []
    rc, err = run_cli(capsys, [command, "-c", str(run / "best.pt"), *extra, "--out", str(out)])
    one_error_line(rc, err, "quantizer '0._input_quantizer' has amax -3.2, which is negative")
    assert not out.exists()


@pytest.mark.parametrize("damage", ["binary", "middle-line", "torn-last-line"])
def test_a_damaged_metrics_file_on_resume(tmp_path, capsys, caplog, tiny, damage):
    """Garbage is one line naming the file; a torn last line (a killed write) is dropped with
    a WARNING and its record rewritten from the checkpoint, so no epoch's record is lost."""
    out = tmp_path / "run"
    assert run_cli(capsys, train_argv(out, "--stop-after", "2", epochs=3))[0] == 0
    metrics = out / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    damaged = {"binary": bytes(range(256)) * 4,
               "middle-line": ("\n".join([lines[0], "garbage!", lines[1]]) + "\n").encode(),
               "torn-last-line": (lines[0] + "\n" + lines[1][:len(lines[1]) // 2]).encode()}
    metrics.write_bytes(damaged[damage])
    rc, err = run_cli(capsys, train_argv(out, "--resume", epochs=3))
    if damage != "torn-last-line":
        one_error_line(rc, err, f"{metrics}")
        assert "restore metrics.jsonl from a backup, or move it away" in err[0]
        assert metrics.read_bytes() == damaged[damage]  # left as it was
        return
    assert rc == 0, err
    assert "dropped the last line of" in caplog.text and str(metrics) in caplog.text
    assert [json.loads(line)["epoch"] for line in metrics.read_text().splitlines()] == [1, 2, 3]
