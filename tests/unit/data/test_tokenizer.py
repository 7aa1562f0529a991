"""Every tokenizer kind behind one interface, and clear errors for missing or corrupt files."""

from __future__ import annotations

import numpy as np
import pytest

from stoker.data import DataError, load_tokenizer, train_tokenizer
from stoker.data.tokenizer import HFTokenizer, SentencePieceTokenizer, TiktokenTokenizer

TEXT = "To be, or not to be: that is the question.\nWhether 'tis nobler in the mind to suffer"


def test_llama_default_is_sentencepiece_32000():
    tok = load_tokenizer()
    assert isinstance(tok, SentencePieceTokenizer)
    assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (32000, 1, 2)
    ids = tok.encode(TEXT)
    assert len(ids) > 10 and tok.bos_id not in ids and tok.eos_id not in ids
    assert tok.decode(ids) == TEXT
    batch = tok.encode_batch([TEXT, "hello"])
    assert [b.tolist() for b in batch] == [ids, tok.encode("hello")]


def test_gpt2_tiktoken_matches_known_ids():
    tok = load_tokenizer("gpt2")
    assert isinstance(tok, TiktokenTokenizer)
    assert tok.vocab_size == 50257 and tok.eos_id == 50256 == tok.bos_id
    assert tok.encode("hello world") == [31373, 995]  # GPT-2's published ids
    assert tok.decode(tok.encode(TEXT)) == TEXT


def test_trained_tokenizer_json_roundtrip(tmp_path, text_folder):
    tok = train_tokenizer(str(text_folder), output=tmp_path / "tok", vocab_size=400, min_frequency=1)
    assert isinstance(tok, HFTokenizer)
    assert (tmp_path / "tok" / "tokenizer.json").is_file()
    assert tok.vocab_size == 400
    assert tok.bos_id == 1 and tok.eos_id == 2 and tok.pad_id == 3  # <unk> <s> </s> <pad>
    ids = tok.encode(TEXT)
    assert tok.decode(ids) == TEXT and max(ids) < 400
    again = load_tokenizer(tmp_path / "tok")  # a folder resolves to its tokenizer.json
    assert again.fingerprint == tok.fingerprint and again.encode(TEXT) == ids


def test_batch_encode_uses_threads_and_keeps_order():
    tok = load_tokenizer("llama", num_threads=2)
    texts = [f"line {i} " * (i + 1) for i in range(50)]
    out = tok.encode_batch(texts)
    assert all(isinstance(a, np.ndarray) for a in out)
    assert [a.tolist() for a in out] == [tok.encode(t) for t in texts]


def test_fingerprint_depends_on_file_content(tmp_path):
    a = load_tokenizer("llama")
    b = load_tokenizer("gpt2")
    assert a.fingerprint != b.fingerprint and len(a.fingerprint) == 16
    assert load_tokenizer("llama").fingerprint == a.fingerprint


@pytest.mark.parametrize("name,content", [("tokenizer.model", b"\x00garbage" * 10),
                                          ("tokenizer.json", b"{not json"),
                                          ("bad.tiktoken", b"%%% not base64 ranks\n")])
def test_corrupt_tokenizer_file_names_the_file(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DataError, match=str(path).replace(".", r"\.")):
        load_tokenizer(path)


def test_missing_and_unknown_tokenizer(tmp_path):
    with pytest.raises(DataError, match="not found.*built-in name"):
        load_tokenizer(tmp_path / "nope.model")
    (tmp_path / "vocab.txt").write_text("a\nb\n")
    with pytest.raises(DataError, match="unknown tokenizer file type"):
        load_tokenizer(tmp_path / "vocab.txt")
    (tmp_path / "empty.model").write_bytes(b"")
    with pytest.raises(DataError, match="is empty"):
        load_tokenizer(tmp_path / "empty.model")
    with pytest.raises(DataError, match="holds no tokenizer"):
        load_tokenizer(tmp_path)


def test_sentencepiece_as_hf_tokenizers_gives_the_same_ids():
    """The tokenizer.json written next to exported models (no protobuf needed) encodes like SentencePiece."""
    import random

    from stoker.data.hf_tokenizer import sentencepiece_to_tokenizers
    from stoker.data.sources import shakespeare_files

    tok = load_tokenizer("llama")
    rust = sentencepiece_to_tokenizers(tok, add_bos=False)
    rng = random.Random(0)
    alphabet = [" ", "  ", "a", "the", "\n", "\t", "é", "日本", "😀", "1", ".", "\u2581"]
    texts = [p.read_text(encoding="utf-8")[:20_000] for p in shakespeare_files()[:5]]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 20))) for _ in range(1000)]
    assert [e.ids for e in rust.encode_batch(texts)] == tok.sp.encode(texts)
    assert (sentencepiece_to_tokenizers(tok, add_eos=True).encode("x").ids
            == [tok.bos_id, *tok.sp.encode("x"), tok.eos_id])


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_tokenizers_pickle(name):
    """A tokenizer can be a flow artifact: it pickles (the word cache is rebuilt, not shipped)."""
    import pickle

    tok = load_tokenizer(name)
    tok.encode_batch(["warm the cache up"])
    back = pickle.loads(pickle.dumps(tok))
    assert back.encode("To be, or not to be") == tok.encode("To be, or not to be")
    assert (getattr(back, "words", None) is None) == (getattr(tok, "words", None) is None)
