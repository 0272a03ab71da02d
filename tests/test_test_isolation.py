"""The test suite never reads or writes the repository's engines/, export/ and runs/
(``make demo`` fills them; tests/conftest.py runs every test in its own tmp_path)."""

from __future__ import annotations

from pathlib import Path

from conftest import ROOT, folder_listing


def test_every_test_runs_in_its_own_tmp_path(tmp_path):
    assert Path.cwd() == tmp_path
    assert ROOT not in Path.cwd().resolve().parents


def test_the_guard_sees_a_file_written_into_a_default_folder(tmp_path):
    (tmp_path / "engines").mkdir()
    (tmp_path / "engines" / "README.md").write_text("x")
    before = folder_listing(tmp_path)
    (tmp_path / "runs" / "demo").mkdir(parents=True)
    assert folder_listing(tmp_path) != before  # a new folder
    before = folder_listing(tmp_path)
    (tmp_path / "engines" / "report.json").write_text("{}")
    after = folder_listing(tmp_path)
    assert set(after) - set(before) == {str(Path("engines/report.json"))}
