"""A SentencePiece BPE model as a Hugging Face ``tokenizers`` BPE (what transformers' LlamaConverter builds),
without protobuf: exported model folders get a ``tokenizer.json`` that ``AutoTokenizer`` loads on any
transformers version, next to the original ``tokenizer.model``.
"""

from __future__ import annotations

import json
from pathlib import Path

from stoker.data.tokenizer import SentencePieceTokenizer, load_tokenizer
from stoker.errors import DataError


def sentencepiece_to_tokenizers(tok: SentencePieceTokenizer, *, add_bos: bool = True, add_eos: bool = False):
    """A ``tokenizers.Tokenizer`` giving the same ids as ``tok`` (byte fallback, BOS/EOS as asked)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors

    sp = tok.sp
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    merges = []
    for piece, pid in vocab.items():  # every way a piece splits into two pieces, ranked by the piece's score
        local = [(piece[:k], piece[k:], sp.get_score(pid)) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        merges.extend(sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]])))
    merges.sort(key=lambda m: m[2], reverse=True)
    unk = sp.id_to_piece(sp.unk_id())
    rust = Tokenizer(models.BPE(vocab=vocab, merges=[(a, b) for a, b, _ in merges], unk_token=unk, fuse_unk=True,
                                byte_fallback=True))
    rust.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    rust.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                      decoders.Strip(" ", 1, 0)])
    specials = [(sp.id_to_piece(i), i) for i, on in ((tok.bos_id, add_bos), (tok.eos_id, add_eos))
                if on and i is not None]
    if specials:
        template = " ".join([specials[0][0]] * bool(add_bos and tok.bos_id is not None) + ["$A"]
                            + [sp.id_to_piece(tok.eos_id)] * bool(add_eos and tok.eos_id is not None))
        rust.post_processor = processors.TemplateProcessing(single=template, special_tokens=specials)
    return rust


def write_hf_tokenizer(model_file: str | Path, out: str | Path) -> list[str]:
    """Write ``tokenizer.json`` + ``tokenizer_config.json`` for a SentencePiece BPE ``model_file`` into ``out``
    (BOS added like Llama's tokenizer); returns the file names."""
    tok = load_tokenizer(Path(model_file))
    if not isinstance(tok, SentencePieceTokenizer):
        raise DataError(f"{model_file} is not a SentencePiece model")
    out = Path(out)
    sentencepiece_to_tokenizers(tok).save(str(out / "tokenizer.json"))
    sp = tok.sp
    name = {i: sp.id_to_piece(i) for i in (tok.bos_id, tok.eos_id, sp.unk_id(), tok.pad_id) if i is not None}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 30, "add_bos_token": True,
              "add_eos_token": False, "clean_up_tokenization_spaces": False,
              "bos_token": name.get(tok.bos_id), "eos_token": name.get(tok.eos_id), "unk_token": name[sp.unk_id()]}
    if tok.pad_id is not None:
        config["pad_token"] = name[tok.pad_id]
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return ["tokenizer.json", "tokenizer_config.json"]
