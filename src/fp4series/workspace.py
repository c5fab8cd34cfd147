"""What ``build`` and ``prefix`` both need, kept below both: the pin's release and its commit
inside a checkout, and the venv's interpreter.

Stdlib-only at import time, like ``build`` (which bootstraps the venv); gitpython and the lock
are imported when called.
"""

from __future__ import annotations

from pathlib import Path

from fp4series.errors import SeriesError

PIN_TAG = "v0.5.11"  # fallback when upstream.lock cannot be read


def pin_release() -> object:
    """The pin's ``Release`` from upstream.lock."""
    from fp4series import lock, paths

    return lock.load_lock(paths.default_lock_path()).pin


def resolve_base(checkout: Path, base: str | None) -> str:
    """Commit SHA of the pin inside the checkout (``--base``, else the pin's tag)."""
    import git

    repo = git.Repo(checkout)
    rev = base or str(getattr(pin_release(), "tag", PIN_TAG))
    try:
        return repo.commit(rev).hexsha
    except (git.BadName, ValueError) as exc:
        raise SeriesError(
            f"{checkout} has no {rev!r} to build against",
            hint=f"fetch the tag {PIN_TAG} into the checkout or pass --base <commit of the pin>",
        ) from exc


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"
