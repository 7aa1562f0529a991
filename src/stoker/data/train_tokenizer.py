"""``train_tokenizer``: a byte-level BPE tokenizer trained on any source with Hugging Face ``tokenizers``.

Writes ``tokenizer.json`` (+ ``tokenizer_config.json`` naming BOS/EOS/PAD) into a folder that
``prepare(tokenizer=<folder>)`` and ``transformers.PreTrainedTokenizerFast(tokenizer_file=...)`` load.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from stoker.data.sources import Source, resolve_source
from stoker.data.tokenizer import HFTokenizer, load_tokenizer
from stoker.errors import ConfigError, DataError

logger = logging.getLogger(__name__)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]


def train_tokenizer(source: str | os.PathLike | Source = "shakespeare", output: str | os.PathLike = "tokenizer",
                    vocab_size: int = 8000, min_frequency: int = 2, text_field: str = "text",
                    doc_split: str = "file", max_docs: int | None = None) -> HFTokenizer:
    """Train a byte-level BPE vocabulary of ``vocab_size`` tokens on ``source``; returns the loaded tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ConfigError(f"vocab_size={vocab_size}: a byte-level BPE needs at least {256 + len(SPECIAL_TOKENS)}")
    src = resolve_source(source, text_field=text_field, doc_split=doc_split)
    out = Path(output).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    count = 0

    def texts():
        nonlocal count
        for doc in src.documents():
            if max_docs is not None and count >= max_docs:
                return
            count += 1
            yield doc

    tok.train_from_iterator(texts(), trainer=trainer)
    if count == 0:
        raise DataError(f"source {source!r} holds no documents; check the path/glob and the text field")
    tmp = out / ".tokenizer.json.tmp"
    tok.save(str(tmp))
    os.replace(tmp, out / "tokenizer.json")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "pad_token": "<pad>", "model_max_length": 1 << 30}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    logger.info("trained a %d-token BPE on %d documents -> %s", tok.get_vocab_size(), count, out)
    return load_tokenizer(out / "tokenizer.json")
