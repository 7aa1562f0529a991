"""argparse types that refuse an out-of-range value when the command line is read, before any work starts.

argparse prints the usage and ``PROG: error: argument --max-workers: must be a whole number >= 1, got 0``
(exit 2)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

PORT_RANGE = (1, 65535)


def int_at_least(low: int) -> Callable[[str], int]:
    """A type for a whole number >= ``low``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {low}, got {value}")
        return value

    parse.__name__ = f"whole number >= {low}"
    return parse


def number_at_least(low: float) -> Callable[[str], float]:
    """A type for a finite number >= ``low``."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number >= {low:g}, got {text!r}") from None
        if not value >= low or value == float("inf"):  # NaN fails `>=`
            raise argparse.ArgumentTypeError(f"must be a finite number >= {low:g}, got {text}")
        return value

    parse.__name__ = f"number >= {low:g}"
    return parse


def port(text: str) -> int:
    """A TCP port to listen on: 1 to 65535."""
    low, high = PORT_RANGE
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number ({low}-{high}), got {text!r}") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"must be a port number ({low}-{high}), got {value}")
    return value


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)
