"""The word cache gives exactly SentencePiece's ids, and is used only for models where that holds."""

from __future__ import annotations

import io
import random

import pytest
import sentencepiece as spm

from stoker.data import load_tokenizer
from stoker.data.sources import shakespeare_files
from stoker.data.wordcache import WordCache, model_settings, why_not

ALPHABET = [" ", " ", " ", "a", "b", "the", "And", "\n", "\n\n", "\t", "\r\n", "\u2581", "é", "日本", "😀", "1", "42",
            ".", ",", "'", "  "]


def random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 24))) for _ in range(n)]


def trained_model(tmp_path, name: str, **options):
    """A small real SentencePiece model trained on Shakespeare with the given options."""
    text = shakespeare_files()[0].read_text(encoding="utf-8")[:200_000]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text.splitlines()), model_writer=buf, vocab_size=500,
                                   minloglevel=2, **options)
    path = tmp_path / name / "tokenizer.model"
    path.parent.mkdir()
    path.write_bytes(buf.getvalue())
    return path


def assert_same_as_sentencepiece(tok, texts):
    expected = tok.sp.encode(texts)
    got = tok.encode_batch(texts)
    for text, g, e in zip(texts, got, expected, strict=True):
        assert g.tolist() == e, f"{text!r}: {g.tolist()} != {e}"


def test_llama_model_qualifies_and_matches_on_the_whole_corpus():
    tok = load_tokenizer("llama")
    assert tok.words is not None and tok.splits_long_texts
    assert model_settings(tok.sp) == {"model_type": "bpe", "normalizer": "identity", "add_dummy_prefix": True,
                                      "remove_extra_whitespaces": False, "escape_whitespaces": True,
                                      "whitespace_as_suffix": False}
    plays = [p.read_text(encoding="utf-8") for p in shakespeare_files()]
    assert_same_as_sentencepiece(tok, plays)  # ~9.5 MB, ~3.2 M tokens
    assert len(tok.words) > 100_000
    assert_same_as_sentencepiece(tok, plays[:5])  # again, now all from the cache


def test_llama_matches_on_adversarial_texts():
    tok = load_tokenizer("llama")
    assert_same_as_sentencepiece(tok, random_texts(3000))
    assert_same_as_sentencepiece(tok, ["", " ", "   ", "\u2581", "a" * 5000, " x " * 100, "\n" * 7])
    assert_same_as_sentencepiece(tok, ["", ""])
    assert tok.encode_batch([]) == []


def test_full_cache_starts_over_and_stays_exact():
    tok = load_tokenizer("llama")
    small = WordCache(tok.sp, num_threads=1, max_words=64)
    texts = random_texts(500, seed=1) + [p.read_text(encoding="utf-8")[:3000] for p in shakespeare_files()[:3]]
    sizes = []
    for start in range(0, len(texts), 50):
        batch = texts[start:start + 50]
        assert [a.tolist() for a in small.encode_batch(batch)] == tok.sp.encode(batch)
        sizes.append(len(small))
        assert len(small) <= 64 + 1 + len(set().union(*map(small.words, batch)))
    assert any(b < a for a, b in zip(sizes, sizes[1:], strict=False)), f"the cache never started over: {sizes}"


def test_texts_holding_the_placeholder_go_to_sentencepiece():
    tok = load_tokenizer("llama")
    texts = ["a\x00b", "x  y", "\x00  \x00", "plain text"]
    assert tok.words.words(texts[0]) is None
    assert_same_as_sentencepiece(tok, texts)


@pytest.mark.parametrize("byte_fallback", [True, False])
def test_identity_bpe_model_qualifies(tmp_path, byte_fallback):
    """With byte fallback a line break is a byte piece (line keys on); without, it is an unknown character,
    which SentencePiece fuses with its unknown neighbours, so lines stay inside the words (line keys off)."""
    path = trained_model(tmp_path, "bpe", model_type="bpe", normalization_rule_name="identity",
                         remove_extra_whitespaces=False, byte_fallback=byte_fallback)
    tok = load_tokenizer(path)
    assert tok.words is not None and tok.words.lines is byte_fallback
    assert_same_as_sentencepiece(tok, random_texts(2000, seed=2))
    assert_same_as_sentencepiece(tok, [" \n", "a \nb", " \n x", "日本 \n\n 😀"])


@pytest.mark.parametrize(("name", "options", "reason"), [
    ("unigram", {"model_type": "unigram"}, "model_type='unigram'"),
    ("nfkc", {"model_type": "bpe"}, "normalizer='nmt_nfkc'"),
    ("nosplit", {"model_type": "bpe", "normalization_rule_name": "identity", "remove_extra_whitespaces": False,
                 "split_by_whitespace": False}, "joins a word to the space after it"),
])
def test_other_models_use_sentencepiece_alone(tmp_path, name, options, reason):
    path = trained_model(tmp_path, name, **options)
    tok = load_tokenizer(path)
    assert tok.words is None and not tok.splits_long_texts
    assert reason in why_not(tok.sp)
    assert_same_as_sentencepiece(tok, random_texts(300, seed=3))


def test_the_vocabulary_check_is_needed(tmp_path):
    """On a model whose pieces span spaces, a word cache would change the ids: that is what why_not guards."""
    path = trained_model(tmp_path, "nosplit", model_type="bpe", normalization_rule_name="identity",
                         remove_extra_whitespaces=False, split_by_whitespace=False)
    sp = spm.SentencePieceProcessor(model_file=str(path))
    texts = [p.read_text(encoding="utf-8")[:2000] for p in shakespeare_files()[:3]]
    forced = WordCache(sp, num_threads=1).encode_batch(texts)
    assert any(f.tolist() != e for f, e in zip(forced, sp.encode(texts), strict=True))


def test_balancer_shares_batches_with_sentencepiece_and_learns_the_rates():
    from stoker.data.wordcache import Balancer

    tok = load_tokenizer("llama")
    plays = [p.read_text(encoding="utf-8")[i:i + 2_000]
             for p in shakespeare_files()[:12] for i in range(0, 30_000, 2_000)]
    many_cores = Balancer(WordCache(tok.sp, num_threads=1), threads=64)
    assert many_cores.rates["sp"] > many_cores.rates["cache"]  # most of a batch goes to SentencePiece
    two = Balancer(WordCache(tok.sp, num_threads=1), threads=2)
    before = dict(two.rates)
    for _ in range(2):
        assert [a.tolist() for a in two.encode_batch(plays)] == tok.sp.encode(plays)
        assert [a.tolist() for a in many_cores.encode_batch(plays)] == tok.sp.encode(plays)
    assert two.rates != before and all(rate > 0 for rate in two.rates.values())
    long_first = [" ".join(plays), "short"]  # more than the SentencePiece share: all of it to the cache
    assert two.encode_batch([]) == [] and two.encode_batch(["one"])[0].tolist() == tok.sp.encode("one")
    assert [a.tolist() for a in two.encode_batch(long_first)] == tok.sp.encode(long_first)
    assert len(two.cache) > 1 and len(many_cores.cache) > 1  # both paths took part


def test_forked_child_encodes():
    """A tokenizer used before a fork (e.g. by a DataLoader with fork workers) still works in the child,
    whose copy of the balancer has lost its pool thread."""
    import multiprocessing

    global _CHILD_TOK
    _CHILD_TOK = load_tokenizer("llama")
    texts = ["first batch, in the parent", "with two texts"]
    _CHILD_TOK.encode_batch(texts)  # starts the balancer's thread in the parent
    with multiprocessing.get_context("fork").Pool(1) as pool:
        got = pool.apply_async(_encode_in_child, (texts,)).get(timeout=30)
    assert got == _CHILD_TOK.sp.encode(texts)


_CHILD_TOK = None


def _encode_in_child(texts):
    return [a.tolist() for a in _CHILD_TOK.encode_batch(texts)]
