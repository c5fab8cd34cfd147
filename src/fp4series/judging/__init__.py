"""Judging: the verdict engine. Where does each series patch stand on an upstream tree?

repo     git plumbing: a scratch repo reaching the pin and every release (alternates)
symbols  symbol evidence: the names a patch provides, and where a tree defines them
verdict  the verdict model (Verdict on one tree, PatchResult in series order)
judge    the verdict for one patch on one tree
stack    a whole series on one release, each patch alone and stacked in series order
matrix   every patch against every materialized release
policy   exit-status policies and the committed baseline
render   the Markdown report

The ``rebase-check`` command (commands/rebase_check.py) runs the matrix; the rebase
(fp4series.replay) judges the series on its target release before it replays it.
"""
