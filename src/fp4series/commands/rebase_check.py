"""Rebase check: a verdict for every series patch against every newer upstream release.

For each release in ``upstream.lock`` the wheel is fetched (cached; its sha256 is recorded into the
lock the first time), materialized as a git repo under ``.work/upstream/<version>``, and every
patch is judged twice: on its own on top of the release (``alone`` in the JSON details), and in
series order on top of the release plus the earlier patches that applied. The in-series verdict is
the one reported; ``judged`` says whether all its prerequisites (``Depends-On:``, patches whose
lines it touches or whose files it edits) applied or are upstream (``in-series``) or not
(``partial-series``, with ``prerequisites_not_applied``).

Verdicts (no fuzz, ever):
  clean            ``git apply`` applies every hunk exactly at its line numbers
  offset           applies exactly, but some hunks sit at shifted lines
  three-way        only ``git apply --3way`` applies it (merging against the pin's blobs)
  conflict         does not apply; the failing file and hunks are named
  upstream         reverse-applies, or every hunk's post-image is present, or every symbol the
                   patch provides (``Provides:``, else the public defs/classes it adds) is defined
                   in the release and was not at the pin
  partly-upstream  some hunks/symbols are present, the rest does not apply (per hunk in details)
  moved            a file the patch edits is gone but a file with similar content exists
                   elsewhere (e.g. sglang/jit_kernel/csrc -> sglang/kernels/jit); the patch is
                   re-judged against the new path: ``details.moved_verdict``
  deleted          a file the patch edits is gone and nothing similar exists

Series order: each patch is judged on the release plus, in series order, every earlier patch
that applied there in full. When some of its prerequisites did not apply (``judged``:
``partial-series``), hunks on files that only those patches create are left out and listed in
``not_judged`` (naming the creator): a file the series itself failed to create is no evidence
that upstream deleted anything. ``deleted`` needs a file that exists at the pin.

Exit-status policy (``--policy``):
  newest (default)  exit 1 when, on the newest release checked, a patch's effective verdict
                    (``moved`` counts as its re-judged verdict) is ``conflict`` or ``deleted``:
                    a patch that is not already upstream stops applying. ``partly-upstream`` is
                    a warning (the patch must be trimmed), not a failure. Also exit 1 when the
                    newest release could not be checked at all.
  any               the same rule on every release checked.
  baseline          (CI) exit 1 only when the fresh matrix differs from the committed one
                    (``--baseline``, default reports/rebase-check.json): a patch edited, a
                    release added or dropped, an upstream re-release. Each changed cell is
                    printed (patch, release, old -> new; a moved patch as ``moved->x``) with the
                    command that regenerates the baseline. Known conflicts already in the
                    baseline do not fail. Also exit 1 when the baseline is missing, unreadable,
                    or lists other patches than patches/series. Exit 0 when identical.
  report            never fail (exit 0); for dashboards and for regenerating the baseline:
                    scripts/rebase-check.sh --policy report --json reports/rebase-check.json
                    --md reports/rebase-check.md
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fp4series.commands import add_patches_dir
from fp4series.errors import SeriesError
from fp4series.judging.matrix import run_matrix
from fp4series.judging.policy import POLICIES, apply_policy, load_baseline, regenerate_command
from fp4series.judging.render import to_markdown
from fp4series.judging.repo import JudgeRepo
from fp4series.line import add_line_option
from fp4series.series import load_series
from fp4series.upstream import Target, prepare_release


def newer_targets(lock: Any, version: str) -> list[str]:
    """The lock's rebase targets after VERSION (all of them after the pin), in lock order."""
    names = [t.version for t in lock.targets]
    return names[names.index(version) + 1 :] if version in names else names


def cmd_rebase_check(args: argparse.Namespace) -> int:
    from fp4series import paths
    from fp4series.line import resolve_line

    root = paths.project_root()
    lock_path = Path(args.lock) if args.lock else paths.default_lock_path()
    line = resolve_line(args.line, lock_path=lock_path, root=root)
    patches_dir = Path(args.patches_dir) if args.patches_dir else line.patches_dir
    cache = paths.default_cache_dir()
    work = root / ".work"
    lock = line.lock
    docs = load_series(patches_dir)
    if not docs:
        raise SeriesError(f"the series in {patches_dir} is empty", hint="add patches first")
    wanted = args.releases or newer_targets(lock, line.version)
    if not wanted:
        print(f"no release after {line.version} in {lock_path}: {line.label} has nothing to be "
              "judged against yet")  # fmt: skip
        return 0
    baseline: dict[str, Any] | None = None
    regen = ""
    if args.policy == "baseline":  # fail before the (minutes long) check when it cannot pass
        base_path = Path(args.baseline) if args.baseline else line.rebase_matrix
        shown = _display(base_path, root)
        regen = regenerate_command(shown, str(Path(shown).with_suffix(".md")))
        if not line.is_pin:
            regen = regen.replace("rebase-check.sh ", f"rebase-check.sh --line {line.version} ")
        baseline = load_baseline(base_path, [d.name for d in docs], regen)
    releases = [lock.release(v) for v in wanted]
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    pin = prepare_release(lock, lock.pin.version, work, cache)
    targets: list[Target | tuple[str, str]] = []
    for rel in releases:
        start = time.monotonic()
        try:
            targets.append(prepare_release(lock, rel.version, work, cache))
            lock = resolve_line(args.line, lock_path=lock_path, root=root).lock
        except (SeriesError, OSError, subprocess.SubprocessError) as exc:
            targets.append((rel.version, f"fetch/materialize failed: {exc}"))
        took = time.monotonic() - start
        if took > 1:
            log(f"    {rel.version}: fetched and materialized in {took:.1f}s")
    repo = JudgeRepo(work / "rebase" / "judge")
    m = run_matrix(repo, docs, pin, targets, log=log)
    status, failures = apply_policy(m, args.policy, baseline)
    data = m.to_json(args.policy, status, failures)
    md = to_markdown(m, args.policy, status, failures)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
    if args.md:
        Path(args.md).parent.mkdir(parents=True, exist_ok=True)
        Path(args.md).write_text(md)
    if not args.quiet:
        print(md)
    for f in failures:
        log(f"policy {args.policy}: {f}")
    if args.policy == "baseline":
        if status:
            log(
                f"policy baseline: {len(failures)} cell(s) differ from the committed matrix; "
                "if the change is expected (patch edited, new or re-released upstream), "
                f"regenerate and commit the baseline:\n    {regen}"
            )
        else:
            log("policy baseline: the matrix equals the committed baseline")
    return status


def _display(path: Path, root: Path) -> str:
    """PATH relative to the project root when it lies inside it (for copy-paste commands)."""
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "rebase-check",
        help="verdict of every patch against every newer upstream release",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_line_option(p)
    p.add_argument(
        "--releases",
        nargs="+",
        metavar="VERSION",
        help="default: every lock target after the line's release",
    )
    p.add_argument("--json", metavar="OUT", help="write the JSON matrix here")
    p.add_argument("--md", metavar="OUT", help="write the Markdown table here")
    p.add_argument(
        "--policy",
        choices=POLICIES,
        default="newest",
        help="exit-status policy (see above); CI uses baseline",
    )
    p.add_argument(
        "--baseline",
        metavar="JSON",
        help="committed matrix for --policy baseline (default: reports/rebase-check.json)",
    )
    p.add_argument("--lock", help="upstream.lock (default: the project's)")
    add_patches_dir(p)
    p.add_argument("--quiet", action="store_true", help="do not echo the table")
    p.set_defaults(func=cmd_rebase_check)
