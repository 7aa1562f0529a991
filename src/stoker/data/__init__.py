"""stoker.data: tokenize corpora into packed, checksummed token shards and read them back for training.

    from stoker.data import prepare, open_dataset, BlockLoader
    ref = prepare("shakespeare", tokenizer="llama", block_size=256)   # cached by fingerprint
    loader = BlockLoader(open_dataset(ref), batch_size=8, dp_rank=0, dp_size=1, seed=0)
    batch = next(loader)                                               # int64 [8, 256]
"""

from stoker.data.dataset import PackedDataset, open_dataset
from stoker.data.hf_export import hf_dataset_path, load_hf_dataset
from stoker.data.layout import DatasetRef
from stoker.data.loader import BlockLoader
from stoker.data.prepare import PrepareConfig, prepare
from stoker.data.sources import resolve_source
from stoker.data.tokenizer import Tokenizer, load_tokenizer
from stoker.data.train_tokenizer import train_tokenizer
from stoker.errors import DataError

__all__ = ["BlockLoader", "DataError", "DatasetRef", "PackedDataset", "PrepareConfig", "Tokenizer", "hf_dataset_path",
           "load_hf_dataset", "load_tokenizer", "open_dataset", "prepare", "resolve_source", "train_tokenizer"]
