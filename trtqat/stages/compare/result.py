"""What ``compare`` (and ``demo``) return: the report, typed."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtqat.families.types import MappingView
from trtqat.stages.compare.report import VariantResult


@dataclass
class CompareReport(MappingView):
    """Every variant measured on the same data, and where the report went.

    ``variants`` hold each engine's figures (metric, median latency and throughput per
    batch size, their spread over the interleaved rounds); ``failed`` the variants that
    could not be measured, ``failed_checks`` those measured although a check failed,
    ``unstable`` the figures whose spread is over the flag. ``document`` is report.json.
    Mapping access (``report["variants"]``, ``report["partial"]``, ``report["files"]``)
    reads report.json's document, as the dict of earlier versions did.
    """

    document: dict[str, Any]
    variants: list[VariantResult]
    files: dict[str, Path] = field(default_factory=dict)  # md, json, png

    @property
    def metric(self) -> str:
        """The accuracy (or fidelity) metric of the report: top1, mean_cosine, ..."""
        return str(self.document["metric"])

    @property
    def partial(self) -> bool:
        """Some variants failed, some were measured."""
        return bool(self.document["partial"])

    @property
    def failed(self) -> list[str]:
        return list(self.document["failed"])

    @property
    def failed_checks(self) -> list[str]:
        return list(self.document["failed_checks"])

    @property
    def unstable(self) -> list[str]:
        return list(self.document["unstable"])

    @property
    def ok(self) -> bool:
        """Every variant measured and every check passed (``trtqat compare`` exits 0)."""
        return not self.partial and not self.failed and not self.failed_checks

    def variant(self, name: str) -> VariantResult:
        """The result of the variant called ``name`` (e.g. ``"qat-int8"``)."""
        found = {v.name: v for v in self.variants}
        if name not in found:
            raise KeyError(f"no variant {name!r}; the report has {', '.join(found)}")
        return found[name]

    def _view(self) -> dict[str, Any]:
        return {**self.document, "files": {k: str(v) for k, v in self.files.items()}}
