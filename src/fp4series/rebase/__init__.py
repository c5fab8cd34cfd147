"""Judging series patches against upstream trees, reusable without the rebase-check command.

repo     git plumbing: a scratch repo reaching the pin and every release (alternates)
symbols  symbol evidence: the names a patch provides, and where a tree defines them
verdict  the verdict model (Verdict on one tree, PatchResult in series order)
judge    the verdict for one patch on one tree
stack    a whole series on one release, each patch alone and stacked in series order
matrix   every patch against every materialized release
policy   exit-status policies and the committed baseline
render   the Markdown report
record   a line as the record of its resolutions (Rebased-From:, the drop file)
worktree the rebase's work checkout (apply exactly or 3-way, commit as the patch's author)
replay   the rebase state machine (steps, stops for the user, resume after a kill)

Commands: ``rebase-check`` is ``fp4series.rebase_check``, ``rebase`` is ``fp4series.rebase_series``.
"""
