"""How the CLI reports failures: one message with the fix, no traceback, a non-zero exit."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from stoker.errors import StokerError


def run_cli(fn: Callable[[], int | None]) -> Any:
    try:
        code = fn()
    except StokerError as e:
        from rich.console import Console
        from rich.text import Text

        Console(stderr=True, highlight=False).print(Text("error: ", style="bold red") + Text(str(e)),
                                                    soft_wrap=True)
        if os.environ.get("STOKER_DEBUG"):
            raise
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(code or 0)
