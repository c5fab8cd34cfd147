"""The ``apply`` command: the series onto a checkout as one commit per patch, or nothing changed
(fp4series.apply); ``--recover`` settles what a killed apply left (fp4series.checkout). Its
messages say what to run next: how to take a series left on refs/fp4series/applied/<branch>,
how to rebase the series onto a checkout it does not apply to."""

from __future__ import annotations

import argparse
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import git

from fp4series import checkout as co
from fp4series import gitops, paths
from fp4series.apply import AM_ARGS, RESULT_REF_PREFIX, ApplyReport, apply_series
from fp4series.commands import add_patches_dir
from fp4series.errors import SeriesError, as_series_error
from fp4series.line import Line, add_line_option, resolve_line
from fp4series.series import load_series


@contextmanager
def _terminate_cleanly() -> Iterator[None]:
    """SIGTERM/SIGHUP unwind like Ctrl-C, so scratch worktrees and locks are released."""

    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _cmd_recover(args: argparse.Namespace) -> int:
    """--recover: settle what a killed apply left, apply nothing (checkout.recover_only)."""
    repo = gitops.open_repo(args.checkout)
    try:
        with _terminate_cleanly():
            notes = co.recover_only(repo)
    except KeyboardInterrupt as exc:
        state = exc.state if isinstance(exc, co.Interrupted) else "the checkout is as it was"
        error = SeriesError(
            f"apply --recover was interrupted; {state}",
            hint=f"run scripts/apply.sh --recover {args.checkout} again",
        )
        error.exit_code = 130
        raise error from None
    for note in notes:
        print(note)
    if not notes:
        print("nothing to recover: no apply was interrupted here")
    return 0


def _cmd_apply(args: argparse.Namespace) -> int:
    if args.recover:
        return _cmd_recover(args)
    line = resolve_line(args.line, lock_path=args.lock)
    args.patches_dir = args.patches_dir or line.patches_dir
    patches = load_series(args.patches_dir)
    try:
        with _terminate_cleanly():
            report = apply_series(
                args.checkout,
                patches,
                check=args.check,
                allow_base_mismatch=args.allow_base_mismatch,
                lock=line.lock,
                cache_dir=args.cache_dir,
            )
    except (OSError, git.GitCommandError) as exc:
        error = as_series_error(exc)
        assert error is not None
        raise SeriesError(f"{error}; the checkout was not changed", hint=error.hint) from None
    except KeyboardInterrupt as exc:  # Interrupted: the move was settled first, and says how
        state = exc.state if isinstance(exc, co.Interrupted) else "the checkout is as it was"
        again = f"run scripts/apply.sh{_line_flag(line)} {args.checkout} again to apply the series"
        error = SeriesError(
            f"apply was interrupted; {state}",
            hint="nothing is left to do" if "fully applied" in state else again,
        )
        error.exit_code = 130
        raise error from None
    print(report.format())
    where = args.checkout
    if report.kept:
        ref, _why = report.kept
        raise SeriesError(
            f"the checkout changed while apply ran; your work is as you left it and the series "
            f"is on {ref}",
            hint=_take_hint(where, ref, report.head_before, line),
        )
    if not report.ok:
        failed = next(r for r in report.results if r.status == "failed")
        if _corrupt(failed.detail):
            raise SeriesError(
                f"{failed.name} is corrupt: git cannot read it ({failed.detail}); nothing was "
                "changed",
                hint="restore it from git (git checkout -- "
                f"{_shown(args.patches_dir / failed.name)}) "
                "or regenerate it with scripts/export.sh from the checkout it was made from",
            )
        todo = [r.name for r in report.results if r.status != "already-applied"]
        rest = " ".join(str((args.patches_dir / n).resolve()) for n in todo)
        am = " ".join(a for a in AM_ARGS if a != "--quiet")
        export_base = _export_base(where, report)
        raise SeriesError(
            f"{failed.name} does not apply to {where}; nothing was changed",
            hint=f"rebase the series: git -C {where} am {am} {rest} (every patch not applied "
            "yet, to the end of the series; these flags keep each subject and message, so apply "
            "and export still recognise the commits). git am stops at each patch that does not "
            f"apply: resolve it, git add the files, git -C {where} am --continue, and repeat "
            f"until git am has applied them all ({len(todo)}). Only then regenerate "
            f"{_shown(args.patches_dir)}/ with scripts/export.sh{_line_flag(line)} {where}"
            f"{export_base} (exporting earlier drops the patches not applied yet)",
        )
    return 0


def _corrupt(detail: str) -> bool:
    """git am's words for a patch file it cannot parse (not one whose hunks do not fit)."""
    return any(w in detail for w in ("corrupt patch", "corrupt binary patch", "Patch is empty"))


def _export_base(where: Path, report: ApplyReport) -> str:
    """` --base SHA` when commits of the user's sit between the pin and the series: export from
    the pin would make them patches (0001 on) and renumber the series."""
    if report.base is None:
        return ""
    k = sum(r.status == "already-applied" for r in report.results)
    below = gitops.open_repo(where).commit(f"{report.head_before}~{k}").hexsha
    return "" if below == report.base.commit else f" --base {below[:12]}"


def _take_hint(where: Path, ref: str, started_at: str, line: Line) -> str:
    """How to take the series kept on REF, for what the user did while apply ran."""
    repo = gitops.open_repo(where)
    short = ref.removeprefix(RESULT_REF_PREFIX)
    branch = f"refs/heads/{short}"
    rerun = f"scripts/apply.sh{_line_flag(line)} {where}"
    status = gitops.status_lines(repo)
    untracked = any(s.startswith("??") for s in status)
    stash = f"git -C {where} stash push" + (" --include-untracked" if untracked else "")
    first = f"commit or stash your changes ({stash}), then " if status else ""
    try:
        on = repo.git.symbolic_ref("-q", "HEAD")
    except git.GitCommandError:
        on = None
    if on != branch:
        return (
            f"you left {short} while apply ran: {first}switch back (git -C {where} switch "
            f"{short}) and rerun {rerun}"
        )
    tip = co.branch_tip(repo, branch)
    if tip != started_at:
        return (
            f"{short} moved while apply ran (to {str(tip)[:12]} from {started_at[:12]}: a commit "
            f"of yours?), so {ref} cannot be fast-forwarded onto it: {first}rerun {rerun}, which "
            f"puts the series on top of {short} as it is now"
        )
    merge = f"git -C {where} merge --ff-only {ref}"
    if not status:
        return f"to take it: {merge}"
    return (
        f"to take it and keep your changes: {stash} && {merge} && git -C {where} stash pop "
        f"(if pop reports a conflict, your changes stay in the stash: git -C {where} stash show "
        f"-p; resolve, then git -C {where} stash drop)"
    )


def _line_flag(line: Line) -> str:
    return "" if line.is_pin else f" --line {line.version}"


def _shown(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(paths.project_root()))
    except ValueError:
        return str(path)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "apply",
        help="apply patches/series to a checkout of the pin (--line: another series line)",
        description="Apply patches/series to CHECKOUT (a branch of the pin, clean tree) as one "
        "commit per patch, or change nothing. With --line VERSION: patches/VERSION/series onto "
        "a checkout of upstream VERSION. One apply at a time per checkout "
        "(.git/fp4series-apply.lock). The branch is moved only if the checkout is still as "
        "apply found it; otherwise the series is left on refs/fp4series/applied/<branch> and "
        "your work is untouched. After a kill, run it again: it finishes or rolls back.",
    )
    p.add_argument("checkout", type=Path)
    p.add_argument("--check", action="store_true", help="report what would happen, change nothing")
    p.add_argument(
        "--recover",
        action="store_true",
        help="only finish or undo what a killed apply left (its index.lock names this), "
        "apply nothing",
    )
    p.add_argument(
        "--allow-base-mismatch",
        action="store_true",
        help="apply even when the checkout is not provably the pin",
    )
    add_line_option(p)
    add_patches_dir(p)
    p.add_argument("--lock", type=Path, default=paths.default_lock_path())
    p.add_argument("--cache-dir", type=Path, default=paths.default_cache_dir())
    p.set_defaults(func=_cmd_apply)
