"""Load sgl_kernel 0.4.10's real ScalarType ids on machines where sgl_kernel cannot import.

SGLang 0.5.23 needs ``sglang-kernel==0.4.10``, whose ``import sgl_kernel`` needs a GPU
driver. Without it ``get_scalar_types()`` falls back to placeholder strings that the
Marlin wrappers cannot use. The wheel's ``sgl_kernel/scalar_type.py`` is stdlib-only, so
it is loaded on its own and registered as ``sgl_kernel.scalar_type`` BEFORE any sglang
import (as ``tests/sglang/_scalar_types.py`` does for the pin's 0.4.2).

Wheel lookup: ``$FP4SERIES_SGL_KERNEL_0523_WHEEL`` (a .whl file, a directory holding one,
or an extracted ``scalar_type.py``), else ``<repo>/.work/cache/wheels/``
(``pip download --no-deps sglang-kernel==0.4.10 -d .work/cache/wheels``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
import zipfile
from pathlib import Path

MODULE_NAME = "sgl_kernel.scalar_type"
ENV_VAR = "FP4SERIES_SGL_KERNEL_0523_WHEEL"
WHEEL_GLOB = "sglang_kernel-0.4.10-*.whl"
MEMBER = "sgl_kernel/scalar_type.py"
DEFAULT_DIR = Path(__file__).resolve().parents[2] / ".work" / "cache" / "wheels"
# float4_e2m1f's id (the same in sgl-kernel 0.4.2 and 0.4.10): proves the real module.
FLOAT4_E2M1F_ID = 562949953487106


def _find_source(location: str | os.PathLike[str] | None) -> tuple[str, str] | None:
    path = Path(location or os.environ.get(ENV_VAR) or DEFAULT_DIR)
    if path.is_file() and path.suffix == ".py":
        return path.read_text(), str(path)
    if path.is_dir():
        wheels = sorted(path.glob(WHEEL_GLOB))
        if not wheels:
            return None
        path = wheels[-1]
    if not path.is_file():
        return None
    with zipfile.ZipFile(path) as wheel:
        return wheel.read(MEMBER).decode(), f"{path}!{MEMBER}"


def install(location: str | os.PathLike[str] | None = None) -> bool:
    """Register the wheel's scalar_type module; True if the real ids are available."""
    loaded = sys.modules.get(MODULE_NAME)
    if loaded is not None:
        return hasattr(loaded, "scalar_types")
    if "sglang.srt.layers.quantization.utils" in sys.modules:
        return False  # sglang cached the placeholder types at import: too late
    if importlib.util.find_spec("sgl_kernel") is not None:
        try:
            importlib.import_module(MODULE_NAME)
            return True
        except Exception:  # no GPU driver
            for name in [m for m in sys.modules if m.split(".")[0] == "sgl_kernel"]:
                del sys.modules[name]
    found = _find_source(location)
    if found is None:
        return False
    source, origin = found
    module = types.ModuleType(MODULE_NAME)
    module.__file__ = origin
    sys.modules[MODULE_NAME] = module
    try:
        exec(compile(source, origin, "exec"), module.__dict__)
    except BaseException:
        del sys.modules[MODULE_NAME]
        raise
    return True


def real_scalar_types_loaded() -> bool:
    module = sys.modules.get(MODULE_NAME)
    scalar_types = getattr(module, "scalar_types", None)
    return getattr(getattr(scalar_types, "float4_e2m1f", None), "id", None) == FLOAT4_E2M1F_ID
