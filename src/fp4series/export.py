"""Regenerate patches/*.patch and patches/series from the commits on top of the pin, byte-stable.

Patches are edited as commits on a materialized (or cloned) pin; export writes them back.
Every git option that could make the output depend on the user's config is fixed here, the
commit id in the "From" line is zeroed, and file names keep their stem when the subject is
unchanged, so apply -> export leaves `git diff --exit-code patches/` empty.

Nothing under patches/ is lost: before writing anything, export works out every file it would
overwrite or delete and refuses (listing them) when one holds changes that are not committed
(git status under the patches dir; outside a git work tree every existing file counts), unless
told `force`. A checkout with no commits on the pin would empty the series: refused unless
`allow_empty`. Each file is written to a temporary file and renamed over the old one (keeping
its mode), so a kill mid-export leaves every file either old or new, never truncated (after a
SIGKILL the set of files may mix old and new: rerun the export). SIGINT/SIGTERM/SIGHUP during
the writes wait until the set is whole; the command then says so and exits 130.
Test hooks: FP4SERIES_PAUSE_AT=export-planned (nothing written yet) or export-wrote-one (the
first file written), as checkout.pause.

Public API (stable):
    export_series(checkout, patches_dir, *, base=None, lock=None, cache_dir=None,
                  progress=None, force=False, allow_empty=False, allow_delete=False)
                  -> list[Path]
        base: a revision (default: the lock's tag if the checkout has it, else the base the
        wheel RECORD proves). Writes NNNN-<stem>.patch per commit base..HEAD, rewrites the
        series file (its leading comment block kept) and removes *.patch no longer in range.
        With an explicit base, removing any is refused (listing them) unless allow_delete or
        force: a base above the pin would otherwise silently drop the patches below it.
    format_patch(repo, commit) -> bytes       one commit in the series' exact patch form
    patch_stem(subject) -> str                file stem for a new subject
    FORMAT_PATCH_ARGS, GIT_CONFIG_OVERRIDES
CLI: export CHECKOUT [--line VERSION] [--base REV] [--force] [--allow-empty] [--allow-delete]
"""

from __future__ import annotations

import re
from pathlib import Path

from git import InvalidGitRepositoryError, NoSuchPathError, Repo

from fp4series import gitops, paths
from fp4series.checkout import Interrupted, signals_held, wait_at
from fp4series.errors import SeriesError
from fp4series.lock import Lock, load_lock
from fp4series.patch import END_MARKER, parse_patch
from fp4series.progress import Progress
from fp4series.series import SERIES_FILE, load_series, read_series_names
from fp4series.verify import find_base

FORMAT_PATCH_ARGS = (
    "--stdout",
    "--zero-commit",
    f"--signature={END_MARKER}",  # an end marker: lint refuses a patch cut short
    "--no-stat",
    "--full-index",
    "--no-numbered",
    "--subject-prefix=PATCH",
    "--no-renames",
    "--diff-algorithm=myers",
    "--indent-heuristic",
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--src-prefix=a/",
    "--dst-prefix=b/",
    "--no-attach",
    "--no-thread",
    "--encode-email-headers",
    "--no-notes",
    "--no-to",
    "--no-cc",
    "--no-add-header",
    "-O/dev/null",
)
GIT_CONFIG_OVERRIDES = (
    "format.signOff=false",
    "format.forceInBodyFrom=false",
    "diff.noprefix=false",
    "diff.mnemonicPrefix=false",
    "diff.relative=false",
    "diff.suppressBlankEmpty=false",
    "core.quotePath=true",
)
_NAME = re.compile(r"^\d{4}-(.+)\.patch$")


def format_patch(repo: Repo, commit: str) -> bytes:
    out = repo.git(c=list(GIT_CONFIG_OVERRIDES)).format_patch(
        *FORMAT_PATCH_ARGS, "-1", commit, stdout_as_string=False, strip_newline_in_stdout=False
    )
    assert isinstance(out, bytes)
    return out


def patch_stem(subject: str) -> str:
    text = re.sub(r"^(\s*\[[^\]]*\]\s*)+", "", subject)
    stem = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return stem[:60].rstrip("-") or "patch"


def existing_stems(patches_dir: Path) -> dict[str, str]:
    stems: dict[str, str] = {}
    for path in sorted(patches_dir.glob("*.patch")):
        m = _NAME.match(path.name)
        if not m:
            continue
        try:
            stems.setdefault(parse_patch(path).subject, m.group(1))
        except SeriesError:
            continue  # a broken patch is about to be replaced anyway
    return stems


def _series_header(patches_dir: Path) -> list[str]:
    series = patches_dir / SERIES_FILE
    if not series.exists():
        return []
    header = []
    for line in series.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            break
        header.append(line)
    return header


def _write(path: Path, data: bytes) -> None:
    """Replace PATH by DATA atomically, keeping its mode (paths.write_atomically)."""
    paths.write_atomically(path, data)


def _uncommitted(patches_dir: Path) -> set[str] | None:
    """Names of entries directly in PATCHES_DIR whose content git has not committed (modified,
    staged, untracked or ignored); None when PATCHES_DIR is not in a git work tree."""
    real = patches_dir.resolve()  # a symlinked patches/: the work tree it really lies in
    try:
        repo = Repo(real, search_parent_directories=True)
    except (InvalidGitRepositoryError, NoSuchPathError):
        return None
    if repo.bare or repo.working_tree_dir is None:
        return None
    top = Path(repo.working_tree_dir).resolve()
    if not real.is_relative_to(top):
        return None
    rel = real.relative_to(top).as_posix()
    out = repo.git.status(
        "--porcelain=v1", "-z", "--untracked-files=all", "--ignored", "--", rel or "."
    )
    names: set[str] = set()
    for entry in out.split("\0"):
        if len(entry) > 3 and entry[2] == " ":
            name = Path(entry[3:])
            if name.parent.as_posix() == (rel or "."):
                names.add(name.name)
    return names


def _refuse_losses(patches_dir: Path, planned: dict[str, bytes], stale: list[Path]) -> None:
    """SeriesError listing every file whose uncommitted content the export would replace."""
    uncommitted = _uncommitted(patches_dir)
    why = "not in a git work tree" if uncommitted is None else "uncommitted changes"
    at_risk: list[str] = []
    for name, data in planned.items():
        path = patches_dir / name
        changes = path.exists() and path.read_bytes() != data
        if changes and (uncommitted is None or name in uncommitted):
            at_risk.append(f"  overwrite {path} ({why})")
    for path in stale:
        if uncommitted is None or path.name in uncommitted:
            at_risk.append(f"  delete    {path} ({why})")
    if at_risk:
        raise SeriesError(
            "export would overwrite or delete changes that exist nowhere else; nothing was "
            "written:\n" + "\n".join(at_risk),
            hint=f"commit or save them first (git add {patches_dir}; git commit), or pass "
            "--force to replace them",
        )


def _refuse_deleting(base: str, base_sha: str, count: int, stale: list[Path]) -> None:
    """--base names where the series starts: one that leaves patches out would delete them."""
    listed = "\n".join(f"  delete {p}" for p in stale)
    raise SeriesError(
        f"--base {base} ({base_sha[:12]}) leaves {count} commit(s) on top of it, so export would "
        f"delete {len(stale)} patch(es) that none of them makes; nothing was written:\n{listed}",
        hint="leave out --base (export finds the pin itself) or pass the pin's tag; if those "
        "patches are really to go, pass --allow-delete (or --force)",
    )


def _resolve_base(repo: Repo, base: str | None, lock: Lock, patches_dir: Path, cache: Path | None):
    if base:
        try:
            return repo.commit(base).hexsha
        except Exception:
            raise SeriesError(
                f"{repo.working_tree_dir} has no revision {base}",
                hint="pass --base with the pin's tag or commit",
            ) from None
    try:
        patches = load_series(patches_dir)
    except SeriesError:
        patches = []
    return find_base(repo, lock, patches, cache_dir=cache).commit


def export_series(
    checkout: Path | str,
    patches_dir: Path | str,
    *,
    base: str | None = None,
    lock: Lock | None = None,
    cache_dir: Path | None = None,
    progress: Progress | None = None,
    force: bool = False,
    allow_empty: bool = False,
    allow_delete: bool = False,
) -> list[Path]:
    """Write one patch per commit base..HEAD into PATCHES_DIR and rewrite its series file."""
    progress = progress or Progress()
    patches_dir = Path(patches_dir)
    repo = gitops.open_repo(checkout)
    gitops.require_clean(repo)
    lock = lock or load_lock(paths.default_lock_path())
    base_sha = _resolve_base(repo, base, lock, patches_dir, cache_dir)
    commits = list(repo.iter_commits(f"{base_sha}..HEAD", reverse=True))
    merges = [c for c in commits if len(c.parents) > 1]
    if merges:
        raise SeriesError(
            f"merge commit {merges[0].hexsha[:12]} in {base_sha[:12]}..HEAD; a series is linear",
            hint="rebase your work onto the pin without merges (git rebase BASE)",
        )
    existing = sorted(patches_dir.glob("*.patch")) if patches_dir.is_dir() else []
    if not commits and not allow_empty:
        listed = "".join(f"\n  delete {p}" for p in existing)
        raise SeriesError(
            f"{checkout} has no commits on top of the pin ({base_sha[:12]}..HEAD is empty): "
            f"exporting would empty {patches_dir / SERIES_FILE}{listed}\nnothing was written",
            hint="check out the branch that holds the series commits (scripts/apply.sh makes "
            "one), or pass --allow-empty to really empty the series",
        )
    with progress.step(f"export {len(commits)} commit(s) from {base_sha[:12]}..HEAD"):
        stems = existing_stems(patches_dir) if patches_dir.is_dir() else {}
        planned: dict[str, bytes] = {}
        for i, commit in enumerate(commits, start=1):
            stem = stems.get(commit.summary) or patch_stem(commit.summary)
            name = f"{i:04d}-{stem}.patch"
            if name in planned:
                raise SeriesError(f"two commits would both be written as {name}")
            planned[name] = format_patch(repo, commit.hexsha)
        names = list(planned)
        lines = _series_header(patches_dir) + names
        series_text = ("\n".join(lines) + "\n").encode() if lines else b""
        stale = [p for p in existing if p.name not in planned]
        if base and stale and not (force or allow_delete):
            _refuse_deleting(base, base_sha, len(commits), stale)
        if not force:
            _refuse_losses(patches_dir, {**planned, SERIES_FILE: series_text}, stale)
        patches_dir.mkdir(parents=True, exist_ok=True)
        written: list[Path] = []
        wait_at("export-planned")
        with signals_held() as got:  # a signal waits until the series is whole (no mixed set)
            for name, data in planned.items():
                _write(patches_dir / name, data)
                written.append(patches_dir / name)
                progress.info(name)
                wait_at("export-wrote-one")
            for path in stale:
                path.unlink()
                progress.info(f"removed {path.name}")
            _write(patches_dir / SERIES_FILE, series_text)
            if read_series_names(patches_dir) != names:
                raise SeriesError("internal: the series file does not list what was exported")
    if got:
        raise Interrupted(f"export had finished: {len(written)} patch(es) in {patches_dir}")
    return written
