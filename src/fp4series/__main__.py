"""`python -m fp4series <command>`: the CLI in fp4series.cli.

Ctrl-C while the modules load (before anything is done) is one line and exit status 130, as
anywhere later; scripts/*.sh start python with SIGINT blocked, so that one during the
interpreter's own start-up waits until here (errors.release_sigint). Everything is inside the
try, the imports too. Test hook: FP4SERIES_PAUSE_AT=start waits here, before the imports, as
checkout.pause does.
"""

_code = None
try:
    import os
    import signal
    import sys
    import time

    from fp4series.errors import release_sigint

    release_sigint()

    def _pause_at_start() -> None:
        if "start" not in os.environ.get("FP4SERIES_PAUSE_AT", "").split(","):
            return
        where = os.environ["FP4SERIES_PAUSE_DIR"]
        with open(os.path.join(where, "start.reached"), "w") as fh:
            fh.write(f"{os.getpid()}\n")
        while not os.path.exists(os.path.join(where, "start.release")):
            time.sleep(0.01)

    _pause_at_start()
    from fp4series.cli import main

    _code = main()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ended and said so (errors._ignore_sigint)
except BaseException as _exc:
    import signal
    import sys

    from fp4series.errors import interrupted

    if not interrupted(_exc):
        raise
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if _code is None:
        sys.stderr.write(
            "error: interrupted while starting; nothing was done\n"
            "  what to do: run the same command again\n"
        )
        _code = 130
sys.exit(_code)
