"""One browser page's dashboard: `python -m tui.commands.served [--config PATH] [--read-only]`.

The dashboard of `trackside`, bound to the server that started it. Textual's web driver
ends its input at EOF but not the app, so a dashboard whose server was killed (-9, or an
OOM) would go on polling every host over SSH with no one watching. Here the kernel sends
it SIGTERM when its parent dies (Linux's PR_SET_PDEATHSIG); elsewhere it goes without.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

from training.contract import EXIT_OK

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    parent = os.getppid()
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the signal was asked for
        sys.exit(EXIT_OK)


def main() -> int:
    die_with_parent()
    from tui.commands.dashboard import main as dashboard_main

    return dashboard_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
