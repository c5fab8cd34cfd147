"""Replay: the series carried onto a newer release as a maintained line, patch by patch.

rebase   the rebase as a whole: start, continue, abort, status, check, the final write
engine   the state machine (steps, stops for the user, resume after a kill)
worktree the work checkout (apply exactly or 3-way, commit as the patch's author)
record   a line as the record of its resolutions (Rebased-From:, the drop file)

The ``rebase`` command is commands/rebase.py; what to replay comes from the judging package.
"""
