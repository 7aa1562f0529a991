"""Data preparation: stoker vs the recipe's `datasets.map(tokenize) -> group_texts -> save_to_disk`.

Both prepare the same corpus (the built-in Shakespeare plays repeated to ~--target-mb MB, as JSONL) with
the same tokenizer (the same SentencePiece model, encoded on all cores by both), the same BOS/EOS per
document and the same block size; the raw encode throughput of the tokenizer library itself on all cores
(SentencePiece without stoker's word cache) is measured too.

    python benchmarks/data_prep.py                 # ~30 MB, llama tokenizer, block size 4096
    python benchmarks/data_prep.py --target-mb 10 --block-size 256

Targets: stoker >= 3x the recipe's tokens/s, and >= 70% of the raw encode tokens/s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from itertools import chain
from pathlib import Path


def build_corpus(folder: Path, target_mb: float) -> tuple[Path, list[str]]:
    from stoker.data.sources import shakespeare_files

    plays = [p.read_text(encoding="utf-8") for p in shakespeare_files()]
    size = sum(len(p.encode()) for p in plays)
    repeat = max(1, round(target_mb * 1e6 / size))
    docs = plays * repeat
    path = folder / "corpus.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps({"text": doc}) + "\n")
    return path, docs


def raw_encode(tok, docs: list[str]) -> tuple[int, float, float]:
    """The tokenizer library's own batch encode on all cores (for SentencePiece: without stoker's word cache)."""
    t0, c0 = time.perf_counter(), time.process_time()
    if tok.kind == "sentencepiece":
        encoded = tok.sp.encode(docs, num_threads=tok.num_threads)
    else:
        encoded = tok.encode_batch(docs)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return sum(len(e) for e in encoded) + 2 * len(docs), seconds, cpu  # + BOS/EOS, as both pipelines store


def run_stoker(corpus: Path, tokenizer: str, block_size: int, out: Path) -> tuple[int, float, float, object]:
    from stoker.data import prepare

    t0, c0 = time.perf_counter(), time.process_time()
    ref = prepare(str(corpus), tokenizer=tokenizer, block_size=block_size, val_fraction=0.0, output=str(out),
                  progress=False)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return ref.manifest["stats"]["tokens_encoded"], seconds, cpu, ref


def hf_fast_tokenizer(tok):
    """What the recipe's ``AutoTokenizer.from_pretrained`` yields for a Llama folder: a ``tokenizers`` (Rust) BPE
    built from the same SentencePiece model (transformers' LlamaConverter, done by stoker without protobuf),
    adding BOS and EOS like stoker. ``main`` checks that it produces exactly the same ids."""
    from transformers import PreTrainedTokenizerFast

    from stoker.data.hf_tokenizer import sentencepiece_to_tokenizers

    sp = tok.sp
    rust = sentencepiece_to_tokenizers(tok, add_bos=True, add_eos=True)
    return PreTrainedTokenizerFast(tokenizer_object=rust, bos_token=sp.id_to_piece(tok.bos_id),
                                   eos_token=sp.id_to_piece(tok.eos_id), unk_token=sp.id_to_piece(sp.unk_id()),
                                   model_max_length=1 << 40)


def run_recipe(corpus: Path, tokenize, block_size: int, out: Path, cache: Path) -> tuple[int, float, int]:
    """The published recipe's get_dataset.py: load_dataset -> map(batched tokenize) -> map(group_texts) ->
    save_to_disk. ``tokenize(texts)`` returns ``{"input_ids": ..., "attention_mask": ...}`` like a HF tokenizer."""
    os.environ["HF_DATASETS_CACHE"] = str(cache)
    import datasets

    datasets.disable_progress_bars()
    t0, c0 = time.perf_counter(), time.process_time()
    raw = datasets.load_dataset("json", data_files=str(corpus), split="train", cache_dir=str(cache))
    column_names = raw.column_names
    text_column_name = "text" if "text" in column_names else column_names[0]

    def tokenize_function(examples):
        return tokenize(examples[text_column_name])

    t_load = time.perf_counter()
    tokenized = raw.map(tokenize_function, batched=True, remove_columns=column_names, load_from_cache_file=True)
    t_tok = time.perf_counter()

    def group_texts(examples):
        concatenated = {k: list(chain(*examples[k])) for k in examples.keys()}
        total_length = len(concatenated[list(examples.keys())[0]])
        total_length = (total_length // block_size) * block_size
        result = {k: [t[i:i + block_size] for i in range(0, total_length, block_size)]
                  for k, t in concatenated.items()}
        result["labels"] = result["input_ids"].copy()
        return result

    lm = tokenized.map(group_texts, batched=True, load_from_cache_file=True)
    lm.save_to_disk(str(out))
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    tokens = sum(len(x) for x in tokenized["input_ids"])  # counted after the clock stopped
    first = lm[0]["input_ids"]
    stages = {"load": t_load - t0, "tokenize_map": t_tok - t_load, "group_texts_and_save": t0 + seconds - t_tok}
    return tokens, seconds, cpu, len(lm) * block_size, first, stages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target-mb", type=float, default=30.0, help="corpus size (default: 30 MB)")
    parser.add_argument("--tokenizer", default="llama", help="llama (default), gpt2 or a path")
    parser.add_argument("--block-size", type=int, default=4096, help="tokens per block (recipe: 4096)")
    parser.add_argument("--rounds", type=int, default=1, help="repeat every measurement, keep the best (noisy hosts)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)

    from stoker.data import load_tokenizer, open_dataset

    tmp = Path(tempfile.mkdtemp(prefix="stoker-bench-"))
    rows, results = [], {}
    try:
        corpus, docs = build_corpus(tmp, args.target_mb)
        tok = load_tokenizer(args.tokenizer)
        mb = corpus.stat().st_size / 1e6
        print(f"corpus: {len(docs)} documents, {mb:.1f} MB; tokenizer {tok.name} ({tok.kind}, vocab "
              f"{tok.vocab_size}); block size {args.block_size}; {os.cpu_count()} cores", flush=True)
        hf = hf_fast_tokenizer(tok) if tok.kind == "sentencepiece" else None
        if hf is not None:
            probe = docs[:3]
            assert hf(probe)["input_ids"] == [[tok.bos_id, *tok.encode(d), tok.eos_id] for d in probe], \
                "the converted HF tokenizer must give the same ids"
        def same_library(texts):  # a fresh tokenizer (and word cache) per run, like stoker's prepare
            fresh = load_tokenizer(args.tokenizer)
            ids = [[tok.bos_id, *e.tolist(), tok.eos_id] for e in fresh.encode_batch(texts)]
            return {"input_ids": ids, "attention_mask": [[1] * len(x) for x in ids]}

        variants = [("recipe", "recipe as published (AutoTokenizer fast)", lambda texts: hf(texts))] if hf else []
        variants.append(("recipe_same_lib", f"recipe with stoker's {tok.kind} encoder", same_library))
        best: dict[str, tuple] = {}

        def keep(key, label, n, s, cpu, extra=None):
            if key not in best or s < best[key][3]:
                best[key] = (key, label, n, s, cpu, extra)

        for rnd in range(args.rounds):  # interleaved, so that load from other processes hits all alike
            keep("raw", f"raw encode, {tok.kind} (all cores)", *raw_encode(tok, docs))
            st_tokens, st_s, st_cpu, ref = run_stoker(corpus, args.tokenizer, args.block_size, tmp / f"stoker{rnd}")
            keep("stoker", "stoker prepare", st_tokens, st_s, st_cpu)
            stoker_first = open_dataset(ref)[0].tolist()
            for key, label, fn in variants:
                n, s, cpu, kept, first, stages = run_recipe(corpus, fn, args.block_size, tmp / f"{key}{rnd}",
                                                      tmp / f"hf-cache-{key}{rnd}")
                assert n == st_tokens and first == stoker_first, f"{label}: different tokens than stoker"
                keep(key, label, n, s, cpu, stages)
                results[f"{key}_kept_tokens"] = kept
        rows = [best[k] for k in ("raw", "stoker", *(v[0] for v in variants))]
        for key, label, _, _, _, stages in rows:
            if stages:
                results[f"{key}_stages_s"] = stages
                print(f"  {label}: " + ", ".join(f"{k} {v:.2f}s" for k, v in stages.items()))
        for key, label, n, s, cpu, _ in rows:
            results[f"{key}_tokens_per_s"] = n / s
            results[f"{key}_cpu_s"] = cpu
            print(f"{label:<46} {n:>12,} tokens {s:8.2f} s {n / s:>12,.0f} tokens/s  (CPU {cpu:6.2f} s)")
        stoker_tps = results["stoker_tokens_per_s"]
        for key, label, *_ in rows[2:]:
            results[f"stoker_vs_{key}"] = stoker_tps / results[f"{key}_tokens_per_s"]
            print(f"stoker / {label:<40} = {results[f'stoker_vs_{key}']:.2f}x   (target >= 3x)")
        results["stoker_vs_raw_encode"] = stoker_tps / results["raw_tokens_per_s"]
        print(f"stoker / raw encode {'':<31}= {results['stoker_vs_raw_encode']:.0%}   (target >= 70%)")
        print(f"tokens kept in blocks: stoker {ref.num_tokens:,}; recipe "
              f"{results.get('recipe_kept_tokens', results.get('recipe_same_lib_kept_tokens')):,}")
        results.update(corpus_mb=mb, tokens=st_tokens, block_size=args.block_size, cores=os.cpu_count(),
                       stoker_kept_tokens=ref.num_tokens)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
