"""Judging a whole series on one release: each patch alone and stacked in series order."""

from __future__ import annotations

from collections.abc import Sequence

from fp4series.judging.judge import SeriesFile, judge
from fp4series.judging.repo import JudgeRepo
from fp4series.judging.symbols import (
    judge_symbols,
    patch_symbols,
    symbol_names,
)
from fp4series.judging.verdict import APPLIES, PatchResult
from fp4series.overlap import derived_dependencies
from fp4series.patch import Patch


def check_tree(
    repo: JudgeRepo,
    docs: Sequence[Patch],
    release_tree: str,
    pin_tree: str,
    deps: dict[str, set[str]] | None = None,
) -> dict[str, PatchResult]:
    """Judge every patch on RELEASE_TREE, alone and stacked in series order.

    The reported verdict is always the stacked one: the release plus, in series order, every
    earlier patch that applied in full. When some prerequisites did not apply, hunks on files
    only they create are left out (``not_judged``), never taken as upstream deletions.
    """
    deps = deps if deps is not None else derived_dependencies(docs)
    stack = release_tree
    stacked: list[str] = []
    created: dict[str, SeriesFile] = {}
    results: dict[str, PatchResult] = {}
    for doc in docs:  # one index scan per tree for the whole series
        repo.want(symbol_names(patch_symbols(doc)[0]))
    for doc in docs:
        syms = judge_symbols(repo, doc, release_tree, pin_tree)
        alone = judge(
            repo,
            doc,
            release_tree,
            release_tree=release_tree,
            pin_tree=pin_tree,
            symbols=syms,
            series_files=created,
        )
        in_series = alone
        if stack != release_tree:
            in_series = judge(
                repo,
                doc,
                stack,
                release_tree=release_tree,
                pin_tree=pin_tree,
                symbols=syms,
                series_files=created,
            )
        prereqs = sorted(deps.get(doc.name, set()))
        failed = [
            p
            for p in prereqs
            if p not in stacked
            and not (
                p in results
                and results[p].verdict.effective == "upstream"
                and not results[p].verdict.not_judged
            )
        ]
        results[doc.name] = PatchResult(
            in_series,
            alone,
            in_series,
            "partial-series" if failed else "in-series",
            prereqs,
            failed,
            list(stacked),
        )
        if (
            in_series.effective in APPLIES
            and in_series.apply_text is not None
            and not in_series.not_judged
        ):
            new = repo.apply_to_tree(in_series.apply_text, stack, three_way=in_series.three_way)
            if new is not None:
                stack = new
                stacked.append(doc.name)
        for fd in doc.changes:
            if fd.is_new and fd.new_path and fd.new_path not in created:
                body = "".join(ln for h in fd.hunks for ln in h.images()[1])
                created[fd.new_path] = SeriesFile(doc.name, body)
    return results
