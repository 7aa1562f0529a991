"""Training metrics on rank 0: JSON lines (read by the UI), TensorBoard when installed, rich progress, and a
live copy in the run's store when the trainer runs inside a flow task.

The store copy: a flow task exports ``STOKER_METRICS_STORE`` (the store URL), ``STOKER_METRICS_PREFIX`` (the
series of this task attempt) and ``STOKER_TENSORBOARD_PREFIX`` (see :mod:`stoker.store.metrics`); torchrun's
workers inherit them. Rank 0 then appends every record to that series, uploading a chunk every
``STOKER_METRICS_INTERVAL`` seconds (default 5), and copies its TensorBoard event files at each upload. Anyone
may set the variables by hand to the same effect; unset, nothing goes to a store. A store that fails never
fails training: one warning, and the local JSON lines file still has everything.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stoker.store.metrics import ENV_INTERVAL, ENV_PREFIX, ENV_STORE, ENV_TENSORBOARD
from stoker.store.series import SeriesWriter

log = logging.getLogger(__name__)

TB_SMALL = 1 << 20  # TensorBoard event files up to this size go to the store at every upload of the series,
TB_EVERY = 30.0  # bigger ones at most every TB_EVERY seconds (and at the end)


def flops_per_token(cfg: Any, seq_len: int) -> float:
    """Training FLOPs per token, 6N + 12*L*H*Q*T (``stoker.train.flops`` when present)."""
    try:
        from stoker.train.flops import flops_per_token as ft

        return float(ft(cfg, seq_len))
    except ImportError:  # pragma: no cover - the module ships with stoker
        n = cfg.num_params(include_embeddings=False)
        return 6.0 * n + 12.0 * cfg.n_layers * cfg.n_heads * cfg.head_dim * seq_len


class _GuardedStore:
    """The store as the series writer sees it, keeping the last write error for the one warning."""

    def __init__(self, store: Any) -> None:
        self.store, self.error = store, None

    def write(self, name: str, data: bytes, *, durable: bool = True) -> None:
        try:
            self.store.write(name, data, durable=durable)
        except Exception as e:
            self.error = e
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


class _Series(SeriesWriter):
    """A series writer that also runs `after()` (the TensorBoard upload) at each of its uploads."""

    def __init__(self, store: Any, prefix: str, interval: float, after: Callable[[], None]) -> None:
        self.after = after  # set before the writer's thread starts
        super().__init__(store, prefix, interval)

    def flush(self) -> bool:
        ok = super().flush()
        self.after()
        return ok


class StoreSink:
    """Rank 0's live copy of the metrics in the run's store: the records as a series, and the TensorBoard event
    files under `tb_prefix` (re-uploaded when they grew). Nothing here raises: failures are warned about once."""

    def __init__(self, store_url: str, prefix: str, *, tb_prefix: str = "", tb_dir: Path | None = None,
                 tb_flush: Callable[[], None] | None = None, tb_before: dict[str, tuple[int, int]] | None = None,
                 interval: float = 5.0) -> None:
        from stoker.store.blobs import open_store

        self.url, self.prefix, self.tb_prefix = store_url, prefix, tb_prefix
        self.tb_dir, self.tb_flush = tb_dir, tb_flush
        self.warned = False
        self.tb_last, self.closing = time.monotonic(), False
        self.tb_lock = threading.Lock()
        self.tb_seen = dict(tb_before or {})  # event files of earlier runs in the same folder are not this run's
        self.store = _GuardedStore(open_store(store_url))
        self.series = _Series(self.store, prefix, interval, self._after)

    def add(self, record: dict[str, Any]) -> None:
        self.series.add(record)

    def close(self) -> None:
        self.closing = True
        self.series.close()

    def _after(self) -> None:
        if self.store.error is not None:
            self._warn(self.store.error)
        self._sync_tensorboard()

    def _warn(self, error: BaseException) -> None:
        if not self.warned:
            self.warned = True
            log.warning("could not write training metrics to the store %s (%s: %s); training goes on, and the "
                        "local metrics file has every record", self.url, type(error).__name__, error)

    def _sync_tensorboard(self) -> None:
        if not self.tb_prefix or self.tb_dir is None:
            return
        with self.tb_lock:  # the writer's thread and close() may both get here
            try:
                if self.tb_flush is not None:
                    self.tb_flush()
                stamps = file_stamps(self.tb_dir)
                # an event file goes whole each time it grew: a big one at most every TB_EVERY s (and at the end),
                # so a week-long run on S3 does not re-send megabytes every few seconds
                big = sum(size for size, _ in stamps.values()) > TB_SMALL
                if big and not self.closing and time.monotonic() - self.tb_last < TB_EVERY:
                    return
                self.tb_last = time.monotonic()
                for rel, stamp in stamps.items():
                    if self.tb_seen.get(rel) != stamp:
                        self.store.write(self.tb_prefix + rel, (self.tb_dir / rel).read_bytes(), durable=False)
                        self.tb_seen[rel] = stamp
            except Exception as e:  # noqa: BLE001 - a metric must not fail training
                self._warn(e)


def file_stamps(folder: Path | None) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file under `folder`, by relative path."""
    if folder is None or not folder.is_dir():
        return {}
    out = {}
    for path in folder.rglob("*"):
        if path.is_file():
            st = path.stat()
            out[path.relative_to(folder).as_posix()] = (st.st_size, st.st_mtime_ns)
    return out


def store_sink_from_env(tb_dir: Path | None = None, tb_flush: Callable[[], None] | None = None,
                        tb_before: dict[str, tuple[int, int]] | None = None,
                        env: dict[str, str] | None = None) -> StoreSink | None:
    """The store copy the environment asks for (``STOKER_METRICS_STORE`` and ``STOKER_METRICS_PREFIX``), or None."""
    env = dict(os.environ) if env is None else env
    url, prefix = env.get(ENV_STORE, ""), env.get(ENV_PREFIX, "")
    if not url or not prefix:
        return None
    try:
        interval = float(env.get(ENV_INTERVAL) or 5)
        if not interval > 0:
            raise ValueError("must be > 0")
    except ValueError:
        log.warning("%s=%r is not a number of seconds > 0; using 5", ENV_INTERVAL, env.get(ENV_INTERVAL))
        interval = 5.0
    try:
        return StoreSink(url, prefix, tb_prefix=env.get(ENV_TENSORBOARD, ""), tb_dir=tb_dir, tb_flush=tb_flush,
                         tb_before=tb_before, interval=interval)
    except Exception as e:  # noqa: BLE001 - a metric must not fail training
        log.warning("could not open the store %s for training metrics (%s: %s); training goes on, and the local "
                    "metrics file has every record", url, type(e).__name__, e)
        return None


class MetricsWriter:
    """Appends one JSON object per log interval; mirrors scalars to TensorBoard; shows a progress bar; streams
    the records to the run's store when the environment names one (see the module's docstring)."""

    def __init__(self, path: str, *, enabled: bool, tensorboard: bool, progress: bool, total_steps: int,
                 start_step: int) -> None:
        self.enabled = enabled
        self.path = Path(path)
        self._file = None
        self._tb = None
        self._progress = None
        self._task = None
        self._sink: StoreSink | None = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")
        tb_dir = self.path.parent / "tensorboard"
        tb_before = file_stamps(tb_dir)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(tb_dir))
            except ImportError:
                log.debug("tensorboard not installed; metrics go to %s only", self.path)
        tb = self._tb
        self._sink = store_sink_from_env(tb_dir if tb is not None else None, tb.flush if tb is not None else None,
                                         tb_before)
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
        if self._sink is not None:
            self._sink.add(record)
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
        if self._sink is not None:
            self._sink.close()  # the last chunk and the event files as they are now (flushed by the sink)
            self._sink = None
        if self._tb is not None:
            self._tb.close()
        if self._file is not None:
            self._file.close()
            self._file = None
