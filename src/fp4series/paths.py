"""Where the project's files live, so every command resolves them the same way.

Public API (stable):
    project_root() -> Path        the repository root (env FP4SERIES_ROOT overrides)
    default_lock_path() -> Path   <root>/upstream.lock
    default_patches_dir() -> Path <root>/patches
    default_cache_dir() -> Path   <root>/.work/cache (env FP4SERIES_CACHE overrides)
"""

from __future__ import annotations

import os
from pathlib import Path


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


def default_cache_dir() -> Path:
    env = os.environ.get("FP4SERIES_CACHE")
    return Path(env).resolve() if env else project_root() / ".work" / "cache"
