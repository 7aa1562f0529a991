"""Training metrics on rank 0: JSON lines (read by the UI), TensorBoard when installed, rich progress."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def flops_per_token(cfg: Any, seq_len: int) -> float:
    """Training FLOPs per token, 6N + 12*L*H*Q*T (``stoker.train.flops`` when present)."""
    try:
        from stoker.train.flops import flops_per_token as ft

        return float(ft(cfg, seq_len))
    except ImportError:  # pragma: no cover - the module ships with stoker
        n = cfg.num_params(include_embeddings=False)
        return 6.0 * n + 12.0 * cfg.n_layers * cfg.n_heads * cfg.head_dim * seq_len


class MetricsWriter:
    """Appends one JSON object per log interval; mirrors scalars to TensorBoard; shows a progress bar."""

    def __init__(self, path: str, *, enabled: bool, tensorboard: bool, progress: bool, total_steps: int,
                 start_step: int) -> None:
        self.enabled = enabled
        self.path = Path(path)
        self._file = None
        self._tb = None
        self._progress = None
        self._task = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.path.parent / "tensorboard"))
            except ImportError:
                log.debug("tensorboard not installed; metrics go to %s only", self.path)
        if progress:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"), transient=False, console=Console(stderr=True),
            )  # stdout carries only the result line (pipe it to jq)
            self._progress.start()
            self._task = self._progress.add_task("train", total=total_steps, completed=start_step, info="")

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        record.setdefault("time", time.time())
        assert self._file is not None
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        step = int(record.get("step", 0))
        if self._tb is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in ("step", "time"):
                    self._tb.add_scalar(f"train/{key}", value, step)
        if self._progress is not None and self._task is not None:
            info = f"loss {record.get('loss', float('nan')):.4f} lr {record.get('lr', 0):.2e} " \
                   f"{record.get('tokens_per_s', 0):,.0f} tok/s"
            self._progress.update(self._task, completed=step, info=info)
        else:
            log.info("step %d loss %.4f", step, record.get("loss", float("nan")))

    def advance(self, step: int) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=step)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
        if self._tb is not None:
            self._tb.close()
        if self._file is not None:
            self._file.close()
            self._file = None
