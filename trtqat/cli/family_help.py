"""Help texts completed from the family registry when --help is printed (so they stay true
whatever each family's defaults become); building a parser never imports the families."""

from __future__ import annotations


def families_help(text: str, tasks: tuple[str, ...] | None = None) -> str:
    """``text``, completed in --help by what each registered family takes as ``--model``
    (only the families of ``tasks``, e.g. ``("classification", "detection")``)."""
    from trtqat.cli.parsing import LazyHelp

    def complete() -> str:
        from trtqat import families

        found = [f.summary for f in families.all_families() if tasks is None or f.task in tasks]
        return f"{text}: {'; '.join(found)}"

    return LazyHelp(f"{text} (every model family's; see --help)", complete)


def method_help(text: str) -> str:
    """``text`` and, in --help, each family's default ``--method`` (from its recipe)."""
    from trtqat.cli.parsing import LazyHelp

    def complete() -> str:
        from trtqat import families

        found = ", ".join(f"{m} for {who}" for who, m in families.calibration_defaults())
        return f"{text} (default: the model family's: {found})"

    return LazyHelp(f"{text} (default: the model family's)", complete)
