"""Help and README agree: every ``trtqat`` / ``trtqat-exec`` command line in README.md's code
blocks, and every example in a subcommand's --help, parses with the real parser of that
subcommand (``TRTQAT_DRY_RUN=1``: parse only, nothing runs). A README command with a flag
that no longer exists, or a help example that went stale, fails here."""

from __future__ import annotations

import argparse
import shlex

import pytest
from readme_lib import README, code_blocks, command_lines

from trtqat.cli import build_parser
from trtqat.cli import main as trtqat_main
from trtqat.cli.exec_cmd import main as exec_main

MAINS = {"trtqat": trtqat_main, "trtqat-exec": exec_main}


def readme_commands() -> list[str]:
    """Every command line in README.md's fenced code blocks."""
    return [line for _, block in code_blocks() for line in command_lines(block)]


def help_examples() -> list[str]:
    """Every command line in the subcommands' --help epilogs."""
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [line for sub in subs.choices.values() for line in command_lines(sub.epilog or "")]


def _parses(line: str, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TRTQAT_DRY_RUN", "1")
    words = shlex.split(line)
    try:
        rc = MAINS[words[0]](words[1:])
    except SystemExit as exc:  # argparse refused it
        rc = exc.code
    out = capsys.readouterr()
    assert rc == 0, f"`{line}` does not parse: {out.err.strip() or out.out.strip()}"


def test_the_readme_and_the_help_show_commands():
    readme = readme_commands()
    assert len(readme) >= 30
    assert {line.split()[1] for line in readme if line.startswith("trtqat ")} >= {
        "demo", "train", "calibrate", "qat", "export", "build", "compare", "sensitivity"}
    assert len(help_examples()) >= 10


@pytest.mark.parametrize("line", readme_commands())
def test_readme_command_parses(line, monkeypatch, capsys):
    _parses(line, monkeypatch, capsys)


@pytest.mark.parametrize("line", help_examples())
def test_help_example_parses(line, monkeypatch, capsys):
    _parses(line, monkeypatch, capsys)


def test_an_unknown_flag_points_to_the_subcommands_help(capsys):
    with pytest.raises(SystemExit) as exc:
        trtqat_main(["train", "--bogus"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1
    assert "--bogus" in err[0] and err[0].endswith("(see 'trtqat train --help')")


def test_model_and_method_help_name_every_family(capsys):
    from trtqat import families

    with pytest.raises(SystemExit):
        trtqat_main(["calibrate", "--help"])
    calibrate = " ".join(capsys.readouterr().out.split())
    for who, method in families.calibration_defaults():
        assert f"{method} for {who}" in calibrate
    with pytest.raises(SystemExit):
        trtqat_main(["train", "--help"])
    train = " ".join(capsys.readouterr().out.split())
    assert "yolo_digits" in train and "trtqat train --model yolo_digits" in train
    assert "sentence encoders" not in train  # encoders are not trained here


def test_the_install_list_names_every_extra():
    import tomllib

    extras = tomllib.loads((README.parent / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    section = README.read_text().split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    missing = [e for e in extras if e != "dev" and f"pip install 'trtqat[{e}]'" not in section]
    assert not missing, f"README's install list omits the extras {missing}"
    assert "pip install '.[ort]'" in section  # what a clone needs
