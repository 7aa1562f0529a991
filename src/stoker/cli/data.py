"""``stoker data prepare`` and ``stoker data train-tokenizer`` (also ``python -m stoker.data ...``)."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from stoker.cli.argtypes import non_negative_int, positive_int
from stoker.cli.errors import describe_os_error, stdout_gone
from stoker.errors import StokerError

logger = logging.getLogger(__name__)


def _add_source_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", nargs="?", default="shakespeare",
                   help="'shakespeare' (built-in), a file/folder/glob (txt, jsonl, parquet, .gz/.zst), "
                        "hf:name[:config][:split], or a save_to_disk folder (default: shakespeare)")
    p.add_argument("--text-field", default="text", help="JSON field / column holding the text (default: text)")
    p.add_argument("--doc-split", default="file", choices=["file", "paragraph", "line"],
                   help="what one document of a .txt file is (default: the whole file)")


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``data`` command (with ``prepare`` and ``train-tokenizer``) to an argparse subparsers object."""
    data = subparsers.add_parser("data", help="tokenize and pack corpora; train tokenizers",
                                 description="Tokenize corpora into packed token shards; train tokenizers.")
    sub = data.add_subparsers(dest="data_command", metavar="{prepare,train-tokenizer}")
    sub.required = True

    p = sub.add_parser("prepare", help="tokenize + pack a corpus into shards (cached by fingerprint)")
    _add_source_args(p)
    p.add_argument("--tokenizer", "-t", default="llama",
                   help="'llama' (default, 32000-token SentencePiece), 'gpt2', or a tokenizer.model / "
                        "tokenizer.json / *.tiktoken file or folder")
    p.add_argument("--block-size", "-b", type=int, default=256, help="tokens per training block (default: 256)")
    p.add_argument("--val-fraction", type=float, default=0.01, help="share of documents for validation (0.01)")
    p.add_argument("--output", "-o", default=None,
                   help="folder or fsspec URL (s3://...); default $STOKER_HOME/datasets/<fingerprint>")
    p.add_argument("--format", dest="format", choices=["stoker", "hf"], default="stoker",
                   help="stoker: token shards + manifest (default); hf: a Hugging Face save_to_disk folder "
                        "(input_ids/attention_mask/labels, what NeuronX Distributed's --data_dir reads)")
    p.add_argument("--remainder", choices=["drop", "pad"], default="drop",
                   help="the stream's last partial block: drop it or pad it (default: drop)")
    p.add_argument("--no-bos", dest="add_bos", action="store_false", help="do not open documents with BOS")
    p.add_argument("--no-eos", dest="add_eos", action="store_false", help="do not close documents with EOS")
    p.add_argument("--encoding", default="utf-8", help="text encoding of the files (default: utf-8)")
    p.add_argument("--decode-errors", default="strict", choices=["strict", "replace", "ignore"],
                   help="what to do with undecodable bytes (default: strict = fail)")
    p.add_argument("--shard-mb", type=float, default=128.0, help="target shard size in MiB (default: 128)")
    p.add_argument("--workers", type=int, default=None, help="tokenizer threads (default: all cores)")
    p.add_argument("--overwrite", action="store_true", help="replace what is at --output")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    p.add_argument("--json", action="store_true", help="print the dataset reference as JSON on stdout")
    p.set_defaults(func=cmd_prepare, fn=cmd_prepare)

    t = sub.add_parser("train-tokenizer", help="train a byte-level BPE tokenizer (HF tokenizers) on a corpus")
    _add_source_args(t)
    t.add_argument("--output", "-o", default="tokenizer", help="folder for tokenizer.json (default: ./tokenizer)")
    t.add_argument("--vocab-size", type=int, default=8000, help="vocabulary size (default: 8000)")
    t.add_argument("--min-frequency", type=non_negative_int, default=2, help="minimum pair frequency (default: 2)")
    t.add_argument("--max-docs", type=positive_int, default=None, help="train on at most this many documents")
    t.set_defaults(func=cmd_train_tokenizer, fn=cmd_train_tokenizer)
    return data


def cmd_prepare(args: argparse.Namespace) -> int:
    from stoker.data.prepare import prepare

    ref = prepare(args.source, tokenizer=args.tokenizer, block_size=args.block_size,
                  val_fraction=args.val_fraction, output=args.output, text_field=args.text_field,
                  doc_split=args.doc_split, encoding=args.encoding, decode_errors=args.decode_errors,
                  remainder=args.remainder, add_bos=args.add_bos, add_eos=args.add_eos, shard_mb=args.shard_mb,
                  num_workers=args.workers, overwrite=args.overwrite, progress=not args.quiet, format=args.format)
    if args.json:
        print(json.dumps({"url": ref.url, "fingerprint": ref.fingerprint, "num_tokens": ref.num_tokens,
                          "block_size": ref.block_size, "vocab_size": ref.vocab_size, "splits": ref.splits,
                          "format": ref.format}))
    elif args.quiet:
        print(ref.url)
    return 0


def cmd_train_tokenizer(args: argparse.Namespace) -> int:
    from rich.console import Console

    from stoker.data.train_tokenizer import train_tokenizer

    tok = train_tokenizer(args.source, output=args.output, vocab_size=args.vocab_size,
                          min_frequency=args.min_frequency, text_field=args.text_field, doc_split=args.doc_split,
                          max_docs=args.max_docs)
    Console(stderr=True).print(f"trained {tok.vocab_size:,}-token BPE tokenizer -> {tok.path}")
    print(tok.path)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m stoker.data <prepare|train-tokenizer> ...``."""
    parser = argparse.ArgumentParser(prog="python -m stoker.data")
    sub = parser.add_subparsers(dest="command")
    register(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "data":
        argv = ["data", *argv]  # `python -m stoker.data prepare ...` means `stoker data prepare ...`
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        code = args.func(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:  # `python -m stoker.data prepare --json | head -c 10`: stop quietly, as `stoker` does
        stdout_gone()
    except StokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"error: {describe_os_error(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: nothing was committed", file=sys.stderr)
        return 130
