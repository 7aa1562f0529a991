"""How the CLI reports failures: one message with the fix, no traceback, a non-zero exit.

Every command (`stoker ...`, `python flow.py ...`) runs through :func:`run_cli`:
- a :class:`~stoker.errors.StokerError` is one line, ``error: ...``, and the error's exit code;
- an ``OSError`` that reaches the top (a folder that is a file, no space left, no permission) is one line naming
  the path, exit 1;
- stdout closed by its reader (``stoker runs | head -1``) ends the command quietly with 141, the status a shell
  reports for a writer stopped by SIGPIPE, as ``seq``, ``cat`` and ``grep`` end there;
- Ctrl-C exits 130.
``STOKER_DEBUG=1`` re-raises the first two, with their traceback. Usage errors are argparse's: the usage and one
``PROG: error: ...`` line, exit 2.

A flow file run as a program ends through `stoker._process.end_program` (flow_cli.main_program): as Python's own
exit (its non-daemon threads joined, its atexit handlers run, stdout and stderr flushed), less the interpreter's
teardown, which frees every module one by one (~15 ms, a tenth of a short flow's run).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from stoker.errors import StokerError

SIGPIPE_EXIT = 128 + 13  # 141: what `set -o pipefail` sees from `seq 1 1000000 | head -1`


def say_error(message: str) -> None:
    """Print ``error: message`` on stderr (red on a terminal), as one soft-wrapped line."""
    from rich.console import Console
    from rich.text import Text

    Console(stderr=True, highlight=False).print(Text("error: ", style="bold red") + Text(message), soft_wrap=True)


def describe_os_error(e: OSError) -> str:
    """One line for an ``OSError``: what the system said and the path(s) it said it of."""
    what = e.strerror or str(e) or type(e).__name__
    paths = [str(p) for p in (e.filename, e.filename2) if p is not None]
    return f"{what}: {' -> '.join(paths)}" if paths else what


def stdout_gone() -> NoReturn:
    """The reader of stdout went away: stop now, quietly. stdout is pointed at /dev/null first, so that
    Python's flush at exit does not fail a second time ("Exception ignored ... BrokenPipeError")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (a test's capture)
        pass
    sys.exit(SIGPIPE_EXIT)


def run_cli(fn: Callable[[], int | None]) -> Any:
    """Run one command and exit with its status (see the module's docstring for failures)."""
    try:
        code = fn()
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's flush at exit
    except BrokenPipeError:
        stdout_gone()
    except StokerError as e:
        say_error(str(e))
        if os.environ.get("STOKER_DEBUG"):
            raise
        sys.exit(e.exit_code)
    except OSError as e:  # the file system refused (the paths are the user's): no traceback, the path named
        say_error(describe_os_error(e))
        if os.environ.get("STOKER_DEBUG"):
            raise
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(code or 0)
