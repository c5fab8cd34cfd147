"""fp4series device run: serve SGLang JIT modules from .carry/prebuilt (see prebuilt_hook.py).

Put this directory first on PYTHONPATH; it does nothing unless FP4SERIES_PREBUILT_DIR is set.
"""

import os
import sys

if os.environ.get("FP4SERIES_PREBUILT_DIR"):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    try:
        import prebuilt_hook

        prebuilt_hook.install()
    except Exception as exc:  # never break interpreter start-up; say it loudly
        print(
            f"[prebuilt] hook NOT installed ({type(exc).__name__}: {exc}): JIT compiles",
            file=sys.stderr,
            flush=True,
        )
    finally:
        del sys.path[0]
