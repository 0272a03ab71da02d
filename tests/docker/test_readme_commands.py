"""Every ``trtqat`` / ``trtqat-exec`` command line in docker/README.md runs as written, in
parse-only mode (``TRTQAT_DRY_RUN=1``), with the image's entrypoint and default command."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from trtqat.cli import main as trtqat_main
from trtqat.cli.exec_cmd import main as exec_main

DOCKER = Path(__file__).resolve().parents[2] / "docker"
IMAGES = {"trtqat:gpu": DOCKER / "Dockerfile", "trtqat:cpu": DOCKER / "Dockerfile.cpu"}
MAINS = {"trtqat": trtqat_main, "trtqat-exec": exec_main}
# `docker run` options that take a value when written without "="
VALUED = {"-v", "--volume", "-e", "--env", "--entrypoint", "--gpus", "--shm-size", "--user",
          "-u", "--ipc", "--name", "-w", "--workdir", "--network"}


def readme_runs() -> list[str]:
    """The `docker run` command lines of the README's code blocks, continuations joined."""
    lines, current = [], ""
    for raw in (DOCKER / "README.md").read_text().splitlines():
        if not raw.startswith("    ") and not current:
            continue
        text = raw.strip()
        current = f"{current} {text[:-1].strip()}" if text.endswith("\\") else f"{current} {text}"
        if not text.endswith("\\"):
            if current.strip().startswith("docker run"):
                lines.append(current.strip())
            current = ""
    return lines


def dockerfile_json(path: Path, instruction: str) -> list[str]:
    match = re.search(rf"^{instruction} (\[.*\])\s*$", path.read_text(), re.MULTILINE)
    assert match, f"{path.name} has no {instruction} in JSON form"
    return json.loads(match[1])


def split_run(line: str) -> tuple[str, str, list[str]]:
    """(image, entrypoint, arguments) of a `docker run` line."""
    line = line.split(" # ", 1)[0]
    words = shlex.split(line.replace("$MOUNTS", "").replace("$(id -u)", "1000"))[2:]
    entrypoint, i = None, 0
    while words[i].startswith("-"):
        flag = words[i]
        if flag in VALUED:
            if flag == "--entrypoint":
                entrypoint = words[i + 1]
            i += 2
        else:
            i += 1
    image, args = words[i], words[i + 1:]
    if image in IMAGES:
        entrypoint = entrypoint or dockerfile_json(IMAGES[image], "ENTRYPOINT")[0]
        if not args and entrypoint == dockerfile_json(IMAGES[image], "ENTRYPOINT")[0]:
            args = dockerfile_json(IMAGES[image], "CMD")
    return image, entrypoint or "", args


RUNS = [r for r in readme_runs() if split_run(r)[0] in IMAGES and split_run(r)[1] in MAINS]


def test_the_readme_documents_our_commands() -> None:
    assert len(RUNS) >= 10
    tools = {split_run(r)[1] for r in RUNS}
    assert tools == {"trtqat", "trtqat-exec"}


@pytest.mark.parametrize("line", RUNS)
def test_readme_command_parses_as_written(line: str, monkeypatch, capsys) -> None:
    _, entrypoint, args = split_run(line)
    monkeypatch.setenv("TRTQAT_DRY_RUN", "1")
    try:
        rc = MAINS[entrypoint](args)
    except SystemExit as exc:  # --help exits 0, a parse error exits 2
        rc = exc.code
    out, err = capsys.readouterr()
    assert rc == 0, f"{line}\n{err}"
    assert "--help" in args or "arguments OK" in out


def test_dry_run_still_rejects_bad_flags(monkeypatch, capsys) -> None:
    monkeypatch.setenv("TRTQAT_DRY_RUN", "1")
    with pytest.raises(SystemExit) as exc:
        trtqat_main(["build", "--onnx", "m.onnx"])  # --out missing
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        exec_main(["--onnx=m.onnx", "--noSuchFlag"])
    monkeypatch.setenv("TRTQAT_DRY_RUN", "0")
    assert exec_main(["--loadEngine=missing.engine"]) == 1  # not a dry run: really loads
    assert "does not exist" in capsys.readouterr().err
