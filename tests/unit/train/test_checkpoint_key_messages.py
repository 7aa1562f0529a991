"""Issue 27: a checkpoint read under another STOKER_HOME's key is refused for what it is -- the key -- not as "torn
or damaged". The default STOKER_HOME (./.stoker) follows the current folder, so a standalone run's checkpoints,
signed with the key of the store where they were trained, are read elsewhere under another store's key (or none):
the message names the key in use, where it comes from, the key file that does verify them, and the fix; auto-resume
refuses instead of starting afresh (which would prune them)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from stoker.errors import CheckpointError
from stoker.store.signing import SIGNATURE, store_key
from stoker.train import evaluate, hf
from stoker.train.checkpoint import MANIFEST
from stoker.train.checkpoint_signing import key_store_url, sign_manifest
from stoker.train.trainer import run_training

torch.set_num_threads(1)


def _cfg(out: Path, tokens: Path, steps: int) -> dict:
    return {"out_dir": str(out), "data": {"url": str(tokens), "block_size": 33},
            "train": {"steps": steps, "micro_batch_size": 4, "lr": 3e-3, "log_every": 5},
            "checkpoint": {"every": 2}, "metrics": {"progress": False, "tensorboard": False}}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("keyed")
    rng = np.random.default_rng(1)
    base = rng.integers(0, 256, size=97)
    tokens = root / "tokens.bin"
    np.concatenate([np.roll(base, i % 5) for i in range(22)]).astype(np.uint16).tofile(tokens)
    return Path(run_training(_cfg(root / "run", tokens, 2))["checkpoint"]), tokens


@pytest.fixture
def elsewhere(trained, tmp_path, monkeypatch) -> tuple[Path, Path, Path]:
    """The checkpoint as a standalone run in folder `a` signs it (key files, default STOKER_HOME); the reader then
    works in folder `b`. Returns (checkpoint folder, folder b, tokens)."""
    source, tokens = trained
    for var in ("STOKER_STORE_KEY", "STOKER_HOME", "STOKER_STORE", "STOKER_METRICS_STORE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("STOKER_KEY_DIR", str(tmp_path / "keys"))
    ck = tmp_path / "a" / "run" / "checkpoints"
    shutil.copytree(source.parent, ck)
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    for manifest in ck.glob(f"step_*/{MANIFEST}"):
        doc = json.loads(manifest.read_text())
        del doc[SIGNATURE]
        manifest.write_text(json.dumps(sign_manifest(doc)))  # with the key of a/.stoker/store (made now)
    monkeypatch.chdir(tmp_path / "b")
    return ck, tmp_path / "b", tokens


def test_no_key_here_is_named_with_the_default_home_and_the_fix(elsewhere):
    ck, b, _ = elsewhere
    with pytest.raises(CheckpointError) as err:
        hf.load_checkpoint_weights(str(ck), what="evaluate")
    text = str(err.value)
    assert "\n" not in text and "torn or damaged" not in text, text
    assert "the cause is the key, not damage" in text and f"{b}/.stoker/store" in text
    assert "there is none here" in text and "default STOKER_HOME ./.stoker of the current folder" in text
    assert "run from the folder it was trained from" in text


def test_another_stores_key_is_named_and_auto_resume_refuses(elsewhere, tmp_path):
    ck, b, tokens = elsewhere
    store_key(key_store_url(), create=True)  # this folder's home has a key of its own (another run made it)
    with pytest.raises(CheckpointError) as err:
        hf.export_from_checkpoint(str(ck), tmp_path / "hf")
    text = str(err.value)
    assert "\n" not in text and "torn or damaged" not in text, text
    assert "signed with another store's key (the key file" in text and f"{tmp_path}/keys/" in text
    assert f"the key of the store {b}/.stoker/store" in text and "not damaged" in text
    step = sorted(ck.glob("step_*"))[-1]
    with pytest.raises(CheckpointError, match="bad signature for the signing key in use.*another store's key"):
        evaluate.load_model(str(step))  # a step folder: the same cause, in one line
    kept = sorted(p.name for p in ck.iterdir())
    with pytest.raises(CheckpointError, match="checkpoint.resume=auto: no checkpoint .* verifies with the signing"):
        run_training(_cfg(ck.parent, tokens, 4))
    assert sorted(p.name for p in ck.iterdir()) == kept  # nothing pruned, nothing written
