"""Where the project's files live, so every command resolves them the same way.

Public API (stable):
    project_root() -> Path        the repository root (env FP4SERIES_ROOT overrides)
    default_lock_path() -> Path   <root>/upstream.lock
    default_patches_dir() -> Path <root>/patches
    default_cache_dir() -> Path   <root>/.work/cache (env FP4SERIES_CACHE overrides)
    pin_repo_dir(tag, root=None) -> Path  <root>/.work/upstream/<tag>: the materialized pin

Paths built from what a user or a patch supplies (series entries, ``Group:`` trailers, the lock's
tag and file names) go through these, so no such value can point outside the command's own dirs:
    safe_name(value, what, hint="") -> str   VALUE if it is one plain file name, else
                                        SeriesError naming WHAT and why (separator, '..', ...)
    name_problem(value) -> str | None  why VALUE is not a plain name (None: it is one)
    ref_name_problem(value) -> str | None  why git cannot use a plain VALUE as a ref component
    inside(path, owner) -> Path        PATH with symlinks resolved, SeriesError unless it lies
                                        strictly inside OWNER (also resolved)
    remove_tree_inside(path, owner)    remove PATH (a tree, a file or a link; absent is fine),
                                        only once inside() proved it lies inside OWNER

Writing the project's files (export, rebase, the lock):
    write_atomically(path, data, check=None)  replace PATH by DATA through a temporary file in
        its directory (a kill leaves the old or the new file, never half of one), keeping
        PATH's mode (a new file gets the umask's, as `open` would); byte-identical content is
        left as it is; CHECK(tmp_path) may refuse the new text before it replaces the old
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from fp4series.errors import SeriesError

_PLAIN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]*$")
MAX_NAME = 200


def project_root() -> Path:
    """The repo root: env override, else the checkout this package sits in, else the cwd."""
    env = os.environ.get("FP4SERIES_ROOT")
    if env:
        return Path(env).resolve()
    here = Path(__file__).resolve().parents[2]
    if (here / "upstream.lock").is_file() or (here / "patches").is_dir():
        return here
    return Path.cwd()


def default_lock_path() -> Path:
    return project_root() / "upstream.lock"


def default_patches_dir() -> Path:
    return project_root() / "patches"


def pin_repo_dir(tag: str, root: Path | None = None) -> Path:
    return (root or project_root()) / ".work" / "upstream" / safe_name(tag, "the pin's tag")


def default_cache_dir() -> Path:
    env = os.environ.get("FP4SERIES_CACHE")
    return Path(env).resolve() if env else project_root() / ".work" / "cache"


def name_problem(value: str) -> str | None:
    """Why VALUE cannot be used as one directory entry, or None."""
    if not value:
        return "it is empty"
    if "\0" in value or "\n" in value or "\r" in value:
        return "it contains a NUL or line break"
    if value.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", value):
        return "it is an absolute path"
    if value in (".", ".."):
        return f"it is {value!r}"
    if "/" in value or "\\" in value:
        return "it contains a path separator"
    if len(value) > MAX_NAME:
        return f"it is longer than {MAX_NAME} characters"
    if not _PLAIN.match(value):
        return "it may only hold letters, digits and . _ + - (and not start with . + or -)"
    return None


def ref_name_problem(value: str) -> str | None:
    """Why git cannot use VALUE as one component of a ref name (git check-ref-format), for a
    plain name (name_problem None) that is also a branch: None when it can."""
    if value.endswith(".lock"):
        return "git refuses ref names ending in '.lock'"
    if ".." in value or "@{" in value or value == "@":
        return "git refuses '..', '@{' and a lone '@' in ref names"
    if value.endswith("."):
        return "git refuses ref names ending in '.'"
    return None


def safe_name(value: str, what: str, hint: str = "") -> str:
    """VALUE unchanged if it can be joined to a directory as one entry of it, else SeriesError."""
    problem = name_problem(value)
    if problem:
        raise SeriesError(
            f"{what} {value!r} is not a plain name: {problem}",
            hint=hint
            or "use a short name of letters, digits, '.', '_', '+' and '-' "
            "(it becomes a file or directory name)",
        )
    return value


def inside(path: Path | str, owner: Path | str) -> Path:
    """PATH (its parent's symlinks resolved, its own last component kept) if it lies strictly
    inside OWNER; SeriesError otherwise. Resolving first is what makes a link that points out of
    OWNER count as outside."""
    owner_real = Path(owner).resolve()
    path = Path(path)
    real = path.parent.resolve() / path.name
    if path.name in ("", ".", "..") or owner_real not in real.parents:
        raise SeriesError(
            f"refusing to touch {path}: it does not lie inside {owner_real}",
            hint="this is a bug or a hostile name in the input; nothing was removed",
        )
    return real


def remove_tree_inside(path: Path | str, owner: Path | str) -> None:
    """Remove PATH, proven to lie inside OWNER first; a link is removed, never followed."""
    real = inside(path, owner)
    if real.is_symlink() or real.is_file():
        real.unlink()
    elif real.exists():
        shutil.rmtree(real)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomically(
    path: Path | str, data: bytes, check: Callable[[Path], object] | None = None
) -> None:
    """Replace PATH by DATA atomically, keeping its mode (module doc)."""
    path = Path(path)
    try:
        mode: int | None = stat.S_IMODE(os.stat(path).st_mode)
        if path.read_bytes() == data:
            return
    except FileNotFoundError:
        mode = None
    if mode is None:
        mode = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        if check is not None:
            check(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
