"""Shape strings, profiles checked against the model, build options, engine files."""

from __future__ import annotations

import pytest

from trtqat.engines import BuildOptions, EngineFileError, OptionsError, ShapeError, TensorSpec
from trtqat.engines.fileformat import (
    KIND_PLAN,
    MAGIC,
    atomic_write,
    read_engine_files,
    sidecar_path,
    write_container_file,
    write_engine_files,
)
from trtqat.engines.specs import format_shape, parse_shapes, precision_note, resolve_profile


def test_parse_shapes() -> None:
    assert parse_shapes("x:1x3x224x224,y:4") == {"x": (1, 3, 224, 224), "y": (4,)}
    assert parse_shapes("input:0:1x3") == {"input:0": (1, 3)}  # TF-style names keep colons
    assert parse_shapes("'in put':2x2") == {"in put": (2, 2)}
    assert parse_shapes("s:") == {"s": ()}
    for bad, needle in (("x1x3", "name:DIMS"), ("x:1xax3", "not like"), ("x:1,x:2", "twice"),
                        ("", "no shapes"), ("x:-1x3", "negative")):
        with pytest.raises(ShapeError, match=needle):
            parse_shapes(bad, "--optShapes")
    assert format_shape((None, 3, 8)) == "?x3x8"


X = TensorSpec("x", "float32", (None, 3, 8, 8))
S = TensorSpec("s", "float32", (1, 4))


def test_resolve_profile_fills_min_opt_max() -> None:
    opts = BuildOptions(min_shapes={"x": (1, 3, 8, 8)}, opt_shapes={"x": (4, 3, 8, 8)},
                        max_shapes={"x": (8, 3, 8, 8)})
    x, s = resolve_profile([X, S], opts, dynamic_default_one=True)
    assert (x.min_shape, x.opt_shape, x.max_shape) == ((1, 3, 8, 8), (4, 3, 8, 8), (8, 3, 8, 8))
    assert s.min_shape == s.max_shape == (1, 4)  # static input: its own shape
    (x,) = resolve_profile([X], BuildOptions(shapes={"x": (2, 3, 8, 8)}), dynamic_default_one=False)
    assert x.min_shape == x.opt_shape == x.max_shape == (2, 3, 8, 8)
    (x,) = resolve_profile([X], BuildOptions(), dynamic_default_one=False)
    assert not x.has_profile  # ONNX Runtime: dynamic stays unconstrained
    (x,) = resolve_profile([X], BuildOptions(), dynamic_default_one=True)
    assert x.opt_shape == (1, 3, 8, 8)  # TensorRT: trtexec's "dynamic dims -> 1"


def test_shapes_with_min_opt_max_is_the_run_shape_only() -> None:
    # trtexec's README example: min/opt/max build the profile, --shapes picks the run shape
    opts = BuildOptions(shapes={"x": (3, 3, 8, 8), "s": (1, 4)}, min_shapes={"x": (1, 3, 8, 8)},
                        opt_shapes={"x": (2, 3, 8, 8)}, max_shapes={"x": (4, 3, 8, 8)})
    x, s = resolve_profile([X, S], opts, dynamic_default_one=True)
    assert (x.min_shape, x.opt_shape, x.max_shape) == ((1, 3, 8, 8), (2, 3, 8, 8), (4, 3, 8, 8))
    assert s.min_shape == s.opt_shape == s.max_shape == (1, 4)  # only in --shapes: min=opt=max


@pytest.mark.parametrize("options, needle", [
    (BuildOptions(shapes={"nope": (1,)}), "--shapes: unknown input 'nope'; the model's inputs "
                                          "are: s, x"),
    (BuildOptions(max_shapes={"s": (2, 4)}), "the batch dimension \\(0\\) is fixed to 1 in the "
                                             "model, not 2; re-export the ONNX with a dynamic "
                                             "batch axis"),
    (BuildOptions(shapes={"x": (1, 4, 8, 8)}), "dimension 1 is fixed to 3"),
    (BuildOptions(shapes={"x": (1, 3, 8)}), "rank 3"),
    (BuildOptions(min_shapes={"x": (4, 3, 8, 8)}, opt_shapes={"x": (2, 3, 8, 8)}),
     "min <= opt <= max"),
])
def test_resolve_profile_errors(options: BuildOptions, needle: str) -> None:
    with pytest.raises(ShapeError, match=needle):
        resolve_profile([X, S], options, dynamic_default_one=True)


def test_build_options_are_checked() -> None:
    for bad in ({"builder_optimization_level": 6}, {"memory_pools": {"dla": 1}},
                {"memory_pools": {"workspace": 0}}, {"threads": -1}, {"providers": ("gpu",)},
                {"profiling_verbosity": "verbose"},
                {"shapes": {"x": (1.5,)}}):
        with pytest.raises(OptionsError):
            BuildOptions(**bad)
    opts = BuildOptions(shapes={"x": (1, 2)}, memory_pools={"workspace": 1 << 30})
    assert opts.to_json()["shapes"] == {"x": [1, 2]}


def test_precision_note_names_the_export_variant() -> None:
    assert precision_note(BuildOptions(), "TensorRT 11") is None
    assert "--variant int8-fp16" in precision_note(BuildOptions(best=True), "TensorRT 11")
    assert "--variant int8-fp16" in precision_note(BuildOptions(fp16=True, int8=True), "X")
    assert "--variant int8'" in precision_note(BuildOptions(int8=True), "X")
    assert precision_note(BuildOptions(fp16=True), "X").startswith("--fp16: X takes precision")


def test_engine_file_is_plain_with_a_sidecar(tmp_path) -> None:
    path = write_engine_files(tmp_path / "a" / "e.engine", {"backend": "tensorrt"}, b"\x00plan")
    assert path.read_bytes() == b"\x00plan"  # nothing prepended
    found = read_engine_files(path)
    assert found.header["backend"] == "tensorrt" and found.payload == b"\x00plan"
    assert found.kind == KIND_PLAN and not found.legacy
    assert sidecar_path(path) == tmp_path / "a" / "e.engine.json"
    sidecar_path(path).unlink()
    assert read_engine_files(path).header is None
    with pytest.raises(EngineFileError, match="does not exist"):
        read_engine_files(tmp_path / "missing.engine")
    (tmp_path / "empty.engine").write_bytes(b"")
    with pytest.raises(EngineFileError, match="is empty"):
        read_engine_files(tmp_path / "empty.engine")


def test_old_container_round_trip_and_damage(tmp_path) -> None:
    path = write_container_file(tmp_path / "a" / "e.engine", {"backend": "ort"}, b"p" * 10)
    found = read_engine_files(path)
    assert found.legacy and found.header["backend"] == "ort" and found.payload == b"p" * 10
    data = path.read_bytes()
    (tmp_path / "head.engine").write_bytes(data[:len(MAGIC) + 10])
    with pytest.raises(EngineFileError, match="damaged header"):
        read_engine_files(tmp_path / "head.engine")


def test_atomic_write_leaves_nothing_half_written(tmp_path) -> None:
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")

    def chunks():
        yield b"new data"
        raise KeyboardInterrupt  # interrupted half-way

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, chunks())
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]
