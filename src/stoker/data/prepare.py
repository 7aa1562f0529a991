"""``prepare``: tokenize a corpus on all cores, pack it into blocks and commit shards + manifest atomically.

Three stages overlap: a reader thread batches documents, the calling thread encodes each batch with the
tokenizer's native multi-threaded batch API (which releases the GIL), and a writer thread packs, hashes
and writes. A failure in any stage removes the staging folder: nothing half-written is left behind.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from stoker.data import layout
from stoker.data.layout import DatasetRef
from stoker.data.pack import REMAINDERS, SplitWriter, is_val_document, token_dtype
from stoker.data.sources import DOC_SPLITS, Source, check_encoding, resolve_source
from stoker.data.tokenizer import Tokenizer, load_tokenizer
from stoker.errors import ConfigError, DataError

logger = logging.getLogger(__name__)
_END = object()


@dataclass(kw_only=True)
class PrepareConfig:
    """Settings of :func:`prepare` (all but ``output``/``overwrite``/``progress``/``num_workers`` and the
    batching knobs enter the cache fingerprint)."""

    source: str = "shakespeare"
    tokenizer: str = "llama"
    block_size: int = 256
    val_fraction: float = 0.01
    output: str | None = None
    text_field: str = "text"
    doc_split: str = "file"
    encoding: str = "utf-8"
    decode_errors: str = "strict"
    split: str = "train"
    format: str = "stoker"
    remainder: str = "drop"
    add_bos: bool = True
    add_eos: bool = True
    shard_mb: float = 128.0
    max_doc_chars: int = 1_000_000
    batch_chars: int = 8_000_000
    num_workers: int | None = None
    overwrite: bool = False
    progress: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.block_size, int) or self.block_size < 2:
            raise ConfigError(f"block_size={self.block_size!r}: must be an integer >= 2 (e.g. 256, 4096)")
        if not 0.0 <= float(self.val_fraction) < 1.0:
            raise ConfigError(f"val_fraction={self.val_fraction!r}: must be in [0, 1) (e.g. 0.01)")
        if not isinstance(self.format, str) or self.format not in layout.FORMATS:
            raise ConfigError(f"format={self.format!r}: must be 'stoker' (stoker's token shards, the default) or "
                              "'hf' (a Hugging Face save_to_disk folder for datasets.load_from_disk / NxD's "
                              "--data_dir); pass format='hf' (--format hf) or leave it out")
        if self.remainder not in REMAINDERS:
            raise ConfigError(f"remainder={self.remainder!r}: must be one of {REMAINDERS}")
        if self.doc_split not in DOC_SPLITS:
            raise ConfigError(f"doc_split={self.doc_split!r}: must be one of {DOC_SPLITS}")
        if self.shard_mb <= 0 or self.max_doc_chars < 1000 or self.batch_chars < 1:
            raise ConfigError("shard_mb must be > 0, max_doc_chars >= 1000 and batch_chars >= 1")
        if self.num_workers is not None and self.num_workers < 1:
            raise ConfigError(f"num_workers={self.num_workers!r}: must be >= 1 (default: all cores)")
        check_encoding(self.encoding, self.decode_errors)  # before the tokenizer loads or any folder exists


def dataset_fingerprint(cfg: PrepareConfig, source: Source, tok: Tokenizer) -> str:
    """Identity of the output: source + tokenizer + every setting that changes the tokens."""
    key = {"format": layout.FORMATS[cfg.format], "source": source.fingerprint(), "tokenizer": tok.fingerprint,
           "block_size": cfg.block_size, "val_fraction": float(cfg.val_fraction), "remainder": cfg.remainder,
           "add_bos": cfg.add_bos, "add_eos": cfg.add_eos,
           # None: never cut; "cut@ws": long documents are cut before a word, not at the exact limit
           "max_doc_chars": None if tok.splits_long_texts else f"{cfg.max_doc_chars}:cut@ws"}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]


# Unicode White_Space (what tokenizers' ``\s`` means; str.isspace() also counts the \x1c-\x1f separators)
_SPACES = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
                    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000")


def _cut(text: str, start: int, end: int) -> int:
    """Where a piece of ``text[start:]`` at most ``end - start`` long ends: before the last whitespace
    character that is followed by a non-space (the start of a word and its leading space), so no
    word, and no run of spaces, is split; ``end`` itself when ``text[start:end]`` has none."""
    for c in range(end, start, -1):
        if text[c] in _SPACES and c + 1 < len(text) and text[c + 1] not in _SPACES:
            return c
    return end


def _pieces(text: str, limit: int) -> list[str]:
    """Cut a very long document into pieces of at most ``limit`` characters so that all cores share it
    (BOS/EOS still wrap the whole); only for tokenizers that cannot spread one text over the cores
    themselves (``splits_long_texts``). Cuts fall before the space that opens a word (see :func:`_cut`),
    where pre-tokenizers (GPT-2's regex, SentencePiece's spaces) cut anyway, so the ids equal the
    tokenizer's on the whole text; only a stretch of ``limit`` characters without whitespace is cut
    inside a word."""
    if len(text) <= limit:
        return [text]
    out, start = [], 0
    while len(text) - start > limit:
        end = _cut(text, start, start + limit)
        out.append(text[start:end])
        start = end
    out.append(text[start:])
    return out


class _Stage(threading.Thread):
    """A daemon thread whose exception is re-raised in the caller by ``check()``."""

    def __init__(self, target, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._fn, self.error = target, None

    def run(self) -> None:
        try:
            self._fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            self.error = exc


def _put(q: queue.Queue, item, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return
        except queue.Full:
            continue


def _get(q: queue.Queue, stage: _Stage):
    """The next item a stage put; its exception if it failed."""
    while True:
        try:
            return q.get(timeout=0.1)
        except queue.Empty:
            if not stage.is_alive():  # it always ends with _END unless it failed (or was stopped)
                try:
                    return q.get_nowait()
                except queue.Empty:
                    if stage.error is not None:
                        raise stage.error from None
                    return _END


def _send(q: queue.Queue, item, stage: _Stage) -> None:
    """Hand ``item`` to a stage; raise its exception if it died instead of waiting forever."""
    while stage.is_alive():
        try:
            q.put(item, timeout=0.1)
            return
        except queue.Full:
            continue
    if stage.error is not None:
        raise stage.error
    raise DataError("the shard writer stopped unexpectedly; run prepare again")


class _Progress:
    """One rich progress line: files done/total and input MB/s (file sources), documents/s and tokens/s
    (a no-op when disabled). Counters are read from the source, which counts what its reader thread read."""

    def __init__(self, enabled: bool, src: Source, label: str, described: dict, console=None) -> None:
        self.enabled, self.src, self.docs, self.tokens, self.t0 = enabled, src, 0, 0, time.perf_counter()
        self.files0, self.bytes0 = src.files_done, src.bytes_read  # a source read before counts from here
        self.total_files = described.get("num_files")
        self.total_bytes = described.get("bytes") if src.total_docs is None else None
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = console or Console(stderr=True)
        cols = [SpinnerColumn(), TextColumn("[bold]{task.description}")]
        if src.total_docs or self.total_bytes:
            cols.append(BarColumn())
        if self.total_files is not None:
            cols.append(TextColumn(f"files {{task.fields[files]:,}}/{self.total_files:,}"))
        if "bytes" in described:
            cols.append(TextColumn("{task.fields[mbps]:,.1f} MB/s"))
        cols += [TextColumn("{task.fields[docs]:,} docs ({task.fields[dps]:,.0f}/s)"),
                 TextColumn("{task.fields[tokens]:,} tokens ({task.fields[tps]:,.0f} tok/s)"), TimeElapsedColumn()]
        self.bar = Progress(*cols, console=self.console, transient=False)
        self.task = self.bar.add_task(label, total=src.total_docs or self.total_bytes or None, docs=0, tokens=0,
                                      dps=0.0, tps=0.0, files=0, mbps=0.0)
        self.bar.start()

    @property
    def files(self) -> int:
        return self.src.files_done - self.files0

    @property
    def bytes(self) -> int:
        return self.src.bytes_read - self.bytes0

    def update(self, docs: int = 0, tokens: int = 0) -> None:
        self.docs += docs
        self.tokens += tokens
        if self.enabled:
            dt = max(time.perf_counter() - self.t0, 1e-9)
            self.bar.update(self.task, completed=self.docs if self.src.total_docs else self.bytes, docs=self.docs,
                            tokens=self.tokens, dps=self.docs / dt, tps=self.tokens / dt, files=self.files,
                            mbps=self.bytes / 1e6 / dt)

    def close(self) -> None:
        if self.enabled:
            self.update()  # the reader may have finished its last file after the last batch was counted
            self.bar.stop()


def print_summary(ref: DatasetRef, cached: bool = False, console=None) -> None:
    """A table of what was prepared (or found in the cache)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console(stderr=True)
    m = ref.manifest
    table = Table(title=f"dataset {ref.fingerprint}" + (" (cached)" if cached else ""), show_header=True)
    for col in ("split", "documents", "tokens", "blocks", "dropped", "shards"):
        table.add_column(col, justify="right" if col != "split" else "left")
    for name, s in sorted(m["splits"].items()):
        table.add_row(name, f"{s['num_documents']:,}", f"{s['num_tokens']:,}", f"{s['num_blocks']:,}",
                      f"{s['dropped_tokens']:,}", str(len(s["shards"])))
    console.print(table)
    st = m.get("stats", {})
    console.print(f"tokenizer {m['tokenizer']['name']} (vocab {m['tokenizer']['vocab_size']:,}), block size "
                  f"{m['block_size']}, {m['dtype']}; {st.get('seconds', 0):.1f}s, "
                  f"{st.get('tokens_per_s', 0):,.0f} tokens/s, {st.get('docs_per_s', 0):,.0f} docs/s -> {ref.url}")


def prepare(source: str | os.PathLike | Source = "shakespeare", tokenizer: str | os.PathLike | Tokenizer = "llama",
            block_size: int = 256, val_fraction: float = 0.01, output: str | os.PathLike | None = None,
            **options) -> DatasetRef:
    """Tokenize ``source`` with ``tokenizer``, pack into ``block_size`` blocks, and commit the shards.

    Returns at once with the cached :class:`DatasetRef` when the same source, tokenizer and settings were
    prepared before. ``options`` are the other :class:`PrepareConfig` fields (``text_field``, ``doc_split``,
    ``remainder``, ``shard_mb``, ``num_workers``, ``overwrite``, ``progress`` ...); ``console``: the rich
    console for the progress line and the summary (default: stderr). ``format="hf"`` writes the same blocks
    as a Hugging Face ``save_to_disk`` folder at ``ref.url`` (:mod:`stoker.data.hf_export`).
    """
    console = options.pop("console", None)
    cfg = PrepareConfig(source=str(source), tokenizer=str(tokenizer), block_size=block_size,
                        val_fraction=val_fraction, output=None if output is None else str(output), **options)
    tok = load_tokenizer(tokenizer, num_threads=cfg.num_workers)
    src = resolve_source(source, text_field=cfg.text_field, doc_split=cfg.doc_split, encoding=cfg.encoding,
                         errors=cfg.decode_errors, split=cfg.split)
    if cfg.add_eos and tok.eos_id is None:
        raise DataError(f"{tok.path} has no end-of-sequence token, so documents cannot be separated; train a "
                        "tokenizer with one (`stoker data train-tokenizer`) or pass add_eos=False (--no-eos)")
    fingerprint = dataset_fingerprint(cfg, src, tok)
    target = cfg.output or layout.default_dataset_url(fingerprint)
    show = cfg.progress if cfg.progress is not None else sys.stderr.isatty()
    existing = layout.read_manifest(target)
    if existing is not None and existing.get("fingerprint") == fingerprint and not cfg.overwrite:
        ref = DatasetRef(url=target, fingerprint=fingerprint, manifest=existing)
        logger.info("dataset %s is already prepared at %s", fingerprint, target)
        if show:
            print_summary(ref, cached=True, console=console)
        return ref
    if existing is not None and not cfg.overwrite:
        raise DataError(f"{target} already holds another dataset ({existing.get('fingerprint')}); pass "
                        "overwrite=True (--overwrite) or another output")
    staging = layout.staging_dir(target)
    try:
        manifest = _run(cfg, src, tok, staging, fingerprint, show, console)
        layout.commit(staging, target, overwrite=cfg.overwrite)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raced = layout.read_manifest(target) if isinstance(exc, (DataError, OSError)) else None
        if raced is None or raced.get("fingerprint") != fingerprint:
            raise
        manifest = raced  # another process (e.g. another rank) committed the same dataset first
        logger.info("dataset %s was committed concurrently at %s; using it", fingerprint, target)
    logger.info("prepared %s: %s", target, json.dumps(manifest["stats"]))
    ref = DatasetRef(url=target, fingerprint=fingerprint, manifest=manifest)
    if show:
        print_summary(ref, console=console)
    return ref


def _batches(docs: Iterator[str], batch_chars: int, skipped: dict[str, int]) -> Iterator[list[str]]:
    """Documents in batches of about ``batch_chars`` characters. Empty and whitespace-only documents are
    left out (no BOS/EOS pair without text, no val/train slot) and counted in ``skipped["empty"]``."""
    batch, chars = [], 0
    for doc in docs:
        if not doc or doc.isspace():
            skipped["empty"] += 1
            continue
        batch.append(doc)
        chars += len(doc)
        if chars >= batch_chars or len(batch) >= 65536:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _run(cfg: PrepareConfig, src: Source, tok: Tokenizer, staging, fingerprint: str, show: bool,
         console=None) -> dict:
    t0 = time.perf_counter()
    described = src.describe()
    staging.mkdir(parents=True)
    dtype = token_dtype(tok.vocab_size)
    writer_class, extra, per_token = SplitWriter, {}, dtype.itemsize
    if cfg.format == "hf":
        from stoker.data import hf_export

        writer_class, extra, per_token = hf_export.ArrowSplitWriter, {"fingerprint": fingerprint}, \
            hf_export.BYTES_PER_TOKEN
    shard_blocks = max(1, int(cfg.shard_mb * 2**20) // (cfg.block_size * per_token))
    pad_id = next(i for i in (tok.pad_id, tok.eos_id, 0) if i is not None)
    writers = {name: writer_class(staging, name, dtype=dtype, block_size=cfg.block_size, shard_blocks=shard_blocks,
                                  remainder=cfg.remainder, pad_id=pad_id, **extra) for name in ("train", "val")}
    bos = np.array([tok.bos_id] if cfg.add_bos and tok.bos_id is not None else [], dtype=np.int64)
    # GPT-2 style tokenizers have one <|endoftext|> for both: write it once per document, before it
    same = cfg.add_bos and tok.bos_id is not None and tok.bos_id == tok.eos_id
    eos = np.array([tok.eos_id] if cfg.add_eos and not same else [], dtype=np.int64)
    stop = threading.Event()
    read_q: queue.Queue = queue.Queue(maxsize=2)
    write_q: queue.Queue = queue.Queue(maxsize=2)
    skipped = {"empty": 0}  # written by the reader thread, read once it has finished

    def read() -> None:
        for batch in _batches(src.documents(), cfg.batch_chars, skipped):
            _put(read_q, batch, stop)
            if stop.is_set():
                return
        _put(read_q, _END, stop)

    def write() -> None:
        while not stop.is_set():
            try:
                item = write_q.get(timeout=0.1)
            except queue.Empty:
                continue
            if item is _END:
                return
            for name, (arr, ndocs) in item.items():
                writers[name].add(arr, ndocs)

    reader, writer = _Stage(read, "stoker-data-read"), _Stage(write, "stoker-data-write")
    progress = _Progress(show, src, f"tokenizing {cfg.source}", described, console)
    reader.start()
    writer.start()
    doc_index = 0
    try:
        while True:
            batch = _get(read_q, reader)
            if batch is _END:
                break
            item = _encode_batch(batch, tok, cfg, doc_index, bos, eos)
            doc_index += len(batch)
            ntok = sum(len(a) for a, _ in item.values())
            _send(write_q, item, writer)
            progress.update(len(batch), ntok)
        _send(write_q, _END, writer)
        writer.join()
        if writer.error is not None:
            raise writer.error
    except BaseException:
        stop.set()
        writer.join()  # it finishes its current item and stops: nothing writes into staging after this
        for w in writers.values():
            w.abort()
        raise
    finally:
        progress.close()
    splits = {name: w.close() for name, w in writers.items()}
    _check_splits(splits, cfg, src, skipped_empty=skipped["empty"])
    manifest = _manifest(cfg, tok, fingerprint, described, dtype, splits, progress, skipped["empty"],
                         time.perf_counter() - t0, staging)
    layout.write_manifest(staging, manifest)
    return manifest


def _encode_batch(batch: list[str], tok: Tokenizer, cfg: PrepareConfig, doc_index: int, bos: np.ndarray,
                  eos: np.ndarray) -> dict[str, tuple[np.ndarray, int]]:
    """One batch of documents encoded and split: {"train"|"val": (token ids with BOS/EOS, documents)}."""
    pieces, owner = [], []
    for i, doc in enumerate(batch):
        parts = [doc] if tok.splits_long_texts else _pieces(doc, cfg.max_doc_chars)
        pieces.extend(parts)
        owner.extend([i] * len(parts))
    encoded = tok.encode_batch(pieces)
    per_split: dict[str, list[np.ndarray]] = {"train": [], "val": []}
    counts = {"train": 0, "val": 0}
    prev, last = -1, "train"
    for i, ids in zip(owner, encoded, strict=True):
        if i != prev:  # a new document: close the last one, open this one
            name = "val" if is_val_document(doc_index + i, cfg.val_fraction) else "train"
            if prev >= 0:
                per_split[last].append(eos)
            per_split[name].append(bos)
            counts[name] += 1
            last, prev = name, i
        per_split[name].append(ids)
    if prev >= 0:
        per_split[last].append(eos)
    return {n: (np.concatenate(parts), counts[n]) for n, parts in per_split.items() if parts}


def _manifest(cfg: PrepareConfig, tok: Tokenizer, fingerprint: str, described: dict, dtype: np.dtype,
              splits: dict, progress: _Progress, skipped_empty: int, seconds: float, staging: Path) -> dict:
    """The dataset's manifest: what it holds, how it was made, and what it cost."""
    stored = sum(s["num_tokens"] for s in splits.values())
    seen = progress.tokens
    manifest = {
        "format": layout.FORMATS[cfg.format], "fingerprint": fingerprint,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "source": described, "tokenizer": tok.describe(), "block_size": cfg.block_size, "dtype": dtype.name,
        "settings": {k: v for k, v in asdict(cfg).items() if k not in ("output", "progress", "overwrite", "source",
                                                                      "tokenizer", "block_size")},
        "splits": splits,
        "stats": {"seconds": round(seconds, 3), "documents": progress.docs,
                  "documents_skipped_empty": skipped_empty, "tokens_encoded": seen,
                  "tokens_stored": stored, "tokens_per_s": round(seen / max(seconds, 1e-9), 1),
                  "docs_per_s": round(progress.docs / max(seconds, 1e-9), 1)},
    }
    if "num_files" in described:  # file sources: what was read from disk (compressed bytes when compressed)
        manifest["stats"].update(files=progress.files, bytes_read=progress.bytes,
                                 mb_per_s=round(progress.bytes / 1e6 / max(seconds, 1e-9), 2))
    if cfg.format == "hf":  # the rows' dtypes, and every file with its sha256 (checked by a download)
        from stoker.data import hf_export

        manifest.update(dtype=hf_export.COLUMNS["input_ids"], columns=dict(hf_export.COLUMNS),
                        files=hf_export.file_list(staging))
    return manifest


def _check_splits(splits: dict, cfg: PrepareConfig, src: Source, skipped_empty: int = 0) -> None:
    train, val = splits["train"], splits["val"]
    if train["num_documents"] + val["num_documents"] == 0:
        empty = f", only {skipped_empty} empty or whitespace-only ones" if skipped_empty else ""
        raise DataError(f"source {cfg.source!r} holds no documents (empty corpus{empty}); check the path/glob, "
                        "the text field, --doc-split and that the files are not empty")
    if train["num_blocks"] == 0:
        total = train["dropped_tokens"]
        raise DataError(f"source {cfg.source!r} has only {total} training tokens, fewer than block_size="
                        f"{cfg.block_size}; use a smaller --block-size, a larger corpus, or remainder='pad'")
    if val["num_blocks"] == 0:
        if cfg.val_fraction > 0:
            logger.warning("no validation split: %d validation documents gave fewer than %d tokens; raise "
                           "val_fraction to get one", val["num_documents"], cfg.block_size)
        del splits["val"]
