"""GPU proof runs (first on PYTHONPATH): SGLang's JIT loader through ../jit_hook.py, when
FP4SERIES_PREBUILT_DIR or FP4SERIES_ACT_FALLBACK is set."""

import os
import sys

if os.environ.get("FP4SERIES_PREBUILT_DIR") or os.environ.get("FP4SERIES_ACT_FALLBACK"):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    try:
        import jit_hook

        jit_hook.install()
    except Exception as exc:  # never break interpreter start-up; say it loudly
        print(f"[prebuilt] hook NOT installed ({type(exc).__name__}: {exc}): JIT compiles",
              file=sys.stderr, flush=True)  # fmt: skip
    finally:
        del sys.path[0]
