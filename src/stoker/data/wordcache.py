"""An exact word cache in front of a SentencePiece BPE model.

SentencePiece writes spaces as ``▁`` and merges adjacent symbols into vocabulary pieces. When no piece holds
a ``▁`` right after another character (true of the Llama and Mistral vocabularies: ``▁▁▁▁`` is a piece,
``a▁b`` is not), no merge can reach across the start of a run of spaces, so the ids of a text are the ids of
its space-separated words, each encoded on its own. Real corpora repeat their words (a few hundred thousand
distinct words cover hundreds of millions), so :class:`WordCache` encodes each distinct word once with
SentencePiece (on all cores) and assembles every document from the cache with numpy: the same ids as
SentencePiece, at several times its speed once the common words are cached, and long documents no longer
need cutting to keep all cores busy.

:func:`why_not` decides whether a model qualifies (BPE, identity normalizer, dummy prefix, spaces kept,
the vocabulary property above) and a self-test against SentencePiece confirms it; when anything does not
hold, the tokenizer simply uses SentencePiece for everything.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from itertools import chain

import numpy as np

SPACE = "\u2581"
MAX_WORDS = 1 << 19  # distinct words kept (~60 MB); the cache starts over after the batch that fills it

# Texts whose ids the cache must reproduce exactly before it is used (spaces at the edges and in runs, a
# literal "▁", newlines, tabs, digits, accents, CJK and an emoji that only byte fallback can spell).
SELF_TEST = ["", " ", "  ", "a", " a", "a ", "a  b", "  a  b  ", "\u2581a", "a\u2581\u2581b c", "x\ny", " \n ",
             "\t a\t", "héllo wörld", "日本語 テキスト", "emoji 😀 ok", "1234 5678", "end.\n\n  ACT I.   Scene",
             "That's   it,\r\nwe're done!  "]


def _fields(buf: bytes):
    """(field number, value) pairs of one protobuf message (varint and length-delimited fields only)."""
    i = 0

    def varint() -> int:
        nonlocal i
        value = shift = 0
        while True:
            byte = buf[i]
            i += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    while i < len(buf):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            yield number, varint()
        elif wire == 2:
            size = varint()
            yield number, buf[i:i + size]
            i += size
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")


def model_settings(sp) -> dict:
    """The settings of a SentencePiece model that decide how it splits text (read from its ModelProto)."""
    trainer, normalizer = {}, {}
    for number, value in _fields(sp.serialized_model_proto()):
        if number == 2:
            trainer = dict(_fields(value))
        elif number == 3:
            normalizer = dict(_fields(value))
    return {"model_type": {1: "unigram", 2: "bpe", 3: "word", 4: "char"}.get(trainer.get(3, 1), "?"),
            "normalizer": normalizer.get(1, b"").decode(errors="replace"),
            "add_dummy_prefix": bool(normalizer.get(3, 1)), "remove_extra_whitespaces": bool(normalizer.get(4, 1)),
            "escape_whitespaces": bool(normalizer.get(5, 1)), "whitespace_as_suffix": bool(trainer.get(24, 0))}


def why_not(sp) -> str | None:
    """Why the word cache would not reproduce ``sp`` exactly, or None when it does."""
    try:
        s = model_settings(sp)
    except (ValueError, IndexError) as exc:
        return f"unreadable model proto ({exc})"
    expected = {"model_type": "bpe", "normalizer": "identity", "add_dummy_prefix": True,
                "remove_extra_whitespaces": False, "escape_whitespaces": True, "whitespace_as_suffix": False}
    wrong = [f"{k}={s[k]!r}" for k, v in expected.items() if s[k] != v]
    if wrong:
        return "model settings " + ", ".join(wrong)
    if sp.piece_to_id(SPACE) == sp.unk_id():
        return f"{SPACE!r} is not in the vocabulary"
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        if SPACE in piece.lstrip(SPACE):
            return f"piece {piece!r} joins a word to the space after it"
    return None


def _isolates_newlines(sp) -> bool:
    """True when no merge can involve a line break: no piece longer than one character holds one."""
    return all(len(p) == 1 or "\n" not in p for p in map(sp.id_to_piece, range(sp.get_piece_size())))


_RUN = "\x00"  # in keys, a space beyond the first of a run (texts holding it go to SentencePiece directly)


class _Index(dict):
    """Key -> cache index; a key seen for the first time gets the next index and waits in ``new``."""

    def __init__(self) -> None:
        super().__init__({"": 0})
        self.new: list[str] = []

    def __missing__(self, key: str) -> int:
        self[key] = index = len(self)
        self.new.append(key)
        return index


class WordCache:
    """``encode_batch`` with the ids of ``sp.encode`` (no BOS/EOS), built from a cache of encoded words.

    A key is one word as split at single spaces, with ``"\x00"`` for each space before it beyond the
    first (``"the"``, ``"\x00\x00indented"``); ``""`` is a lone space at the end or before a line break.
    When no piece holds a line break (Llama spells it with a byte piece), a line break starts a key too:
    ``"\nword"`` is the line break and the word with no space before it, encoded as ``"▁\nword"`` less
    the ``"▁"``. Ids live in one flat array with an offset and a length per key, so assembling a batch
    is one dict lookup per word and a numpy gather.
    """

    def __init__(self, sp, num_threads: int, max_words: int = MAX_WORDS) -> None:
        self.sp, self.num_threads, self.max_words = sp, num_threads, max_words
        self._lock = threading.Lock()
        plain = sp.encode("a")
        self._lone = np.asarray(sp.encode("a ")[len(plain):], dtype=np.int32)  # the ids of a lone "▁"
        newline = sp.encode("\n")
        self.lines = (_isolates_newlines(sp) and newline[:len(self._lone)] == self._lone.tolist()
                      and sp.unk_id() not in newline)
        self._reset()

    def _reset(self) -> None:
        self.index = _Index()
        self.flat, self.offsets, self.lengths = self._lone.copy(), np.zeros(1, np.int64), np.array([len(self._lone)])

    def __len__(self) -> int:
        return len(self.index)

    def words(self, text: str) -> list[str] | None:
        """The cache keys of ``text``, in order (None when it holds the placeholder ``"\\x00"``)."""
        if _RUN in text:
            return None
        if SPACE in text:  # SentencePiece reads a literal "▁" as a space
            text = text.replace(SPACE, " ")
        if "  " in text:  # a run of n spaces -> " " + (n-1) placeholders: "a   b" -> "a", "\x00\x00b"
            text = text.replace("  ", " " + _RUN).replace(_RUN + " ", _RUN + _RUN)
        if self.lines and "\n" in text:  # a line break starts a key: "a\nb" -> "a", "\nb"
            text = text.replace("\n", " \n")
        keys = text.split(" ")
        if not keys[0] and len(keys) > 1 and not (self.lines and keys[1][:1] == "\n"):  # leading spaces join
            # the first word (with line keys, a space before a line break is a key alone)
            keys[0:2] = [_RUN + keys[1]]
        return keys

    def _add(self, missing: list[str]) -> None:
        """Encode the keys new to the cache, in the order they were given indices."""
        encoded = self.sp.encode([k.replace(_RUN, " ") for k in missing], num_threads=self.num_threads)
        skip = len(self._lone)  # "\nword" encodes as "▁\nword": drop the ids of the leading lone "▁"
        if self.lines:
            encoded = [e[skip:] if k[:1] == "\n" else e for k, e in zip(missing, encoded, strict=True)]
        lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
        ids = np.fromiter(chain.from_iterable(encoded), np.int32, int(lengths.sum()))
        self.offsets = np.concatenate([self.offsets, len(self.flat) + np.cumsum(lengths) - lengths])
        self.lengths = np.concatenate([self.lengths, lengths])
        self.flat = np.concatenate([self.flat, ids])

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        if not texts:
            return []
        keyed = [self.words(t) if t else [] for t in texts]
        direct = [i for i, k in enumerate(keyed) if k is None]
        for i in direct:
            keyed[i] = []
        keys = list(chain.from_iterable(keyed))
        with self._lock:
            if len(self.index) > self.max_words:  # full after the last batch: start over
                self._reset()
            idx = np.fromiter(map(self.index.__getitem__, keys), np.int64, len(keys))  # new keys get indices
            if self.index.new:
                try:
                    self._add(self.index.new)
                except BaseException:
                    self._reset()  # indices were handed out for ids that never came
                    raise
                self.index.new = []
            lengths = self.lengths[idx]
            ends = np.cumsum(lengths)
            # token j of word k is flat[offsets[k] + j]: one arange, shifted per word
            ids = self.flat[np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(ends - lengths - self.offsets[idx],
                                                                                     lengths)]
        doc_ends = np.concatenate([[0], ends])[np.cumsum(np.fromiter(map(len, keyed), np.int64, len(keyed)))]
        out = np.split(ids, doc_ends[:-1])
        if direct:
            for i, e in zip(direct, self.sp.encode([texts[i] for i in direct], num_threads=self.num_threads),
                            strict=True):
                out[i] = np.asarray(e, dtype=np.int32)
        return out

    @classmethod
    def for_model(cls, sp, num_threads: int) -> tuple[WordCache | None, str | None]:
        """A cache for ``sp`` when it reproduces SentencePiece exactly (checked), else None and why not."""
        reason = why_not(sp)
        if reason is not None:
            return None, reason
        cache = cls(sp, num_threads)
        expected = sp.encode(SELF_TEST)
        for text, got, want in zip(SELF_TEST, cache.encode_batch(SELF_TEST), expected, strict=True):
            if got.tolist() != want:
                return None, f"self-test: {text!r} gives {got.tolist()} instead of {want}"
        cache._reset()
        return cache, None


class Balancer:
    """Shares each batch between the word cache (Python, so one core) and SentencePiece itself on the other
    cores (its thread pool runs without the GIL), in proportion to the throughput each showed on the
    batches so far. On 2 cores nearly everything goes to the cache; on 16 or 64 cores SentencePiece takes
    the larger part and the cache adds one core's worth on top, so a prepare keeps up with the encoder's
    all-core speed on any machine. Both give the same ids, so the split never changes the output."""

    def __init__(self, cache: WordCache, threads: int) -> None:
        self.cache, self.threads = cache, max(1, threads)
        self.rates = {"cache": 20e6, "sp": 1.5e6 * (self.threads - 1)}  # chars/s, replaced by measurements
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0

    def _direct(self, texts: list[str]) -> tuple[list, float]:
        start = time.perf_counter()
        out = self.cache.sp.encode(texts, num_threads=self.threads - 1, return_type="numpy")
        return out, time.perf_counter() - start

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        if self.threads < 2 or len(texts) < 2:
            return self.cache.encode_batch(texts)
        sizes = np.cumsum(np.fromiter(map(len, texts), np.int64, len(texts)))
        share = self.rates["sp"] / (self.rates["sp"] + self.rates["cache"])
        # texts[:k] -> SentencePiece: as many as fit its share (none when the first alone is larger: one long
        # text would run on one SentencePiece thread, slower than the cache)
        k = min(len(texts) - 1, int(np.searchsorted(sizes, share * sizes[-1], side="right")))
        if self._pool is None or self._pool_pid != os.getpid():  # a forked child (e.g. a DataLoader worker)
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="stoker-sentencepiece")  # has no pool thread
            self._pool_pid = os.getpid()
        future = self._pool.submit(self._direct, texts[:k]) if k else None
        start = time.perf_counter()
        cached = self.cache.encode_batch(texts[k:])
        cache_s = time.perf_counter() - start
        direct, direct_s = future.result() if future is not None else ([], 0.0)
        done_sp = int(sizes[k - 1]) if k else 0
        for key, chars, seconds in (("sp", done_sp, direct_s), ("cache", int(sizes[-1]) - done_sp, cache_s)):
            if seconds > 1e-3:
                self.rates[key] = 0.5 * self.rates[key] + 0.5 * float(chars) / seconds
        return [np.asarray(e, dtype=np.int32) for e in direct] + cached
