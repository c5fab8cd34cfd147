"""`python -m fp4series <command>`: the CLI in fp4series.cli.

Ctrl-C while the modules load (before anything is done) is one line and exit status 130, as
anywhere later. Test hook: FP4SERIES_PAUSE_AT=start waits here, before the imports, as
checkout.pause does.
"""

import os
import sys
import time


def _pause_at_start() -> None:
    if "start" not in os.environ.get("FP4SERIES_PAUSE_AT", "").split(","):
        return
    where = os.environ["FP4SERIES_PAUSE_DIR"]
    with open(os.path.join(where, "start.reached"), "w") as fh:
        fh.write(f"{os.getpid()}\n")
    while not os.path.exists(os.path.join(where, "start.release")):
        time.sleep(0.01)


try:
    _pause_at_start()
    from fp4series.cli import main
except KeyboardInterrupt:
    print(
        "error: interrupted while starting; nothing was done\n"
        "  what to do: run the same command again",
        file=sys.stderr,
    )
    sys.exit(130)

sys.exit(main())
