"""Issue 13: a checkpoint's trainer state (step, schedule, loader position, RNGs) is plain tensors and values,
read with ``torch.load(weights_only=True)``: a pickled object planted in a checkpoint never runs code."""

from __future__ import annotations

import hashlib
import io
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from stoker.errors import CheckpointError
from stoker.store.signing import SIGNATURE
from stoker.train import evaluate, hf
from stoker.train.checkpoint import MANIFEST, load_trainer_state, rng_state, set_rng_state
from stoker.train.trainer import run_training

torch.set_num_threads(1)


class Planted:
    """What an attacker with write access to the checkpoint folder pickles: unpickling it calls
    ``open(marker, "w")``, i.e. runs code and creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def planted_trainer_state(marker: Path) -> bytes:
    buf = io.BytesIO()
    torch.save({"step": 2, "schedule": {}, "loader": {}, "rng": {}, "payload": Planted(marker)}, buf)
    return buf.getvalue()


@pytest.fixture
def tokens(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    base = rng.integers(0, 256, size=97)
    path = tmp_path / "tokens.bin"
    np.concatenate([np.roll(base, i % 5) for i in range(22)]).astype(np.uint16).tofile(path)
    return path


def cfg(out: Path, tokens: Path, **train) -> dict:
    return {"out_dir": str(out), "data": {"url": str(tokens), "block_size": 33},
            "train": {"steps": 5, "micro_batch_size": 4, "lr": 3e-3, "log_every": 5, **train},
            "metrics": {"progress": False, "tensorboard": False}}


def test_rng_state_is_plain_data_and_round_trips():
    torch.manual_seed(3)
    np.random.seed(4)
    random.seed(5)
    np.random.standard_normal()  # numpy keeps a cached gaussian: part of the state
    buf = io.BytesIO()
    torch.save(rng_state(), buf)
    saved = load_trainer_state(_wrap(buf.getvalue()), "x")["rng"]  # weights_only=True accepts it
    want = (torch.rand(3), np.random.standard_normal(3), [random.random() for _ in range(3)])
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    set_rng_state(saved)
    got = (torch.rand(3), np.random.standard_normal(3), [random.random() for _ in range(3)])
    assert torch.equal(want[0], got[0]) and np.array_equal(want[1], got[1]) and want[2] == got[2]


def _wrap(rng_bytes: bytes) -> bytes:
    rng = torch.load(io.BytesIO(rng_bytes), weights_only=True)
    buf = io.BytesIO()
    torch.save({"step": 1, "schedule": {"step_count": 1}, "loader": {"epoch": 0}, "rng": rng}, buf)
    return buf.getvalue()


def test_planted_pickle_is_refused_without_running(tmp_path: Path):
    marker = tmp_path / "pwned"
    with pytest.raises(CheckpointError, match=r"checkpoint ck/step_1: its trainer state is not plain tensors"):
        load_trainer_state(planted_trainer_state(marker), "ck/step_1")
    assert not marker.exists()
    # the old format (numpy arrays pickled as objects) is refused the same way, with the fix in the message
    old = io.BytesIO()
    torch.save({"step": 1, "schedule": {}, "loader": {}, "rng": {"numpy": np.random.get_state()}}, old)
    with pytest.raises(CheckpointError, match="checkpoint.resume='never'"):
        load_trainer_state(old.getvalue(), "ck/step_1")


def _replant(step_dir: Path, key: str, data: bytes, work: Path) -> None:
    """Rewrite a committed checkpoint with ``state[key]`` replaced, and re-checksum its manifest as
    someone with write access to the folder would (so the checksums do not give the change away). Without the
    store's key they cannot re-sign it: the manifest is left unsigned."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp

    work.mkdir()
    dcp_to_torch_save(str(step_dir), str(work / "full.pt"))
    state = torch.load(work / "full.pt", weights_only=False)  # the test's own file
    assert key in state
    state[key] = io.BytesIO(data)
    torch.save(state, work / "planted.pt")
    torch_save_to_dcp(str(work / "planted.pt"), str(work / "dcp"))
    manifest = json.loads((step_dir / MANIFEST).read_text())
    for old in step_dir.iterdir():
        if old.name != MANIFEST:
            old.unlink()
    files = {}
    for new in sorted((work / "dcp").iterdir()):
        shutil.copy(new, step_dir / new.name)
        blob = new.read_bytes()
        files[new.name] = {"sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob)}
    manifest["files"] = files
    manifest.pop(SIGNATURE, None)
    (step_dir / MANIFEST).write_text(json.dumps(manifest))


def test_resume_from_a_planted_checkpoint_runs_no_code(tmp_path: Path, tokens: Path, monkeypatch):
    """A real run's committed checkpoint, its trainer state replaced by a pickle whose unpickling creates a
    file (an injected fault: a writer to the shared checkpoint folder). Even when its unsigned manifest is
    accepted (``STOKER_TRUST_UNSIGNED=1``), resuming refuses it and the marker never appears; before,
    ``torch.load(weights_only=False)`` ran it on every resuming rank."""
    monkeypatch.setenv("STOKER_TRUST_UNSIGNED", "1")
    first = run_training(cfg(tmp_path / "part", tokens, stop_after=2))
    step_dir = Path(first["checkpoint"])
    marker = tmp_path / "pwned"
    _replant(step_dir, "trainer_rank0", planted_trainer_state(marker), tmp_path / "work")
    with pytest.raises(CheckpointError, match=r"step_00000002: its trainer state is not plain tensors"):
        run_training(cfg(tmp_path / "other", tokens), resume_from=str(step_dir))
    assert not marker.exists()


def _plant_metadata(step_dir: Path, marker: Path, how: str) -> None:
    """Replace the checkpoint's ``.metadata`` (DCP unpickles it with ``pickle.load``) by a pickle that creates
    ``marker``, and fix its checksum in the manifest, keeping the old signature (``forged``) or dropping it
    (``unsigned``): what a writer of the folder without the store's key can do (an injected fault)."""
    import pickle

    blob = pickle.dumps(Planted(marker))
    (step_dir / ".metadata").write_bytes(blob)
    manifest = json.loads((step_dir / MANIFEST).read_text())
    manifest["files"][".metadata"] = {"sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob)}
    if how == "unsigned":
        del manifest[SIGNATURE]
    (step_dir / MANIFEST).write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def committed(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("signed")
    rng = np.random.default_rng(1)
    base = rng.integers(0, 256, size=97)
    tokens = root / "tokens.bin"
    np.concatenate([np.roll(base, i % 5) for i in range(22)]).astype(np.uint16).tofile(tokens)
    return Path(run_training(cfg(root / "run", tokens, steps=2))["checkpoint"]), tokens


@pytest.mark.parametrize("how", ["forged", "unsigned"])
@pytest.mark.parametrize("reader", ["resume", "export", "evaluate"])
def test_a_rewritten_manifest_is_refused_before_anything_is_unpickled(committed, tmp_path, reader, how):
    """A re-checksummed manifest vouching for a planted ``.metadata`` pickle: every reader refuses it by its
    signature, in one line naming the checkpoint, and the pickle never runs. Before, the unsigned checksums
    matched, and ``dcp.load`` / ``read_metadata`` unpickled it (the marker appeared)."""
    source, tokens = committed
    step_dir = tmp_path / "checkpoints" / source.name
    shutil.copytree(source, step_dir)
    marker = tmp_path / "pwned"
    _plant_metadata(step_dir, marker, how)
    want = "bad signature" if how == "forged" else "not signed.*STOKER_TRUST_UNSIGNED=1"
    with pytest.raises(CheckpointError, match=want) as err:
        if reader == "resume":
            run_training(cfg(tmp_path / "other", tokens), resume_from=str(step_dir))
        elif reader == "export":
            hf.export_from_checkpoint(str(step_dir), tmp_path / "hf")
        else:
            evaluate.load_model(str(step_dir))
    assert "\n" not in str(err.value) and f"{step_dir}/{MANIFEST}" in str(err.value)
    assert not marker.exists()


def test_a_checkpoint_signed_with_another_stores_key_is_refused(committed, tmp_path, monkeypatch):
    """The key is the one of the store the run uses (``$STOKER_METRICS_STORE`` in a flow task and its workers,
    else ``$STOKER_STORE``): with key files instead of ``$STOKER_STORE_KEY``, a checkpoint verifies under its
    own store's key and is refused under another's, with the key file named."""
    from stoker.train.checkpoint_files import Store as CkStore
    from stoker.train.checkpoint_files import split, verify
    from stoker.train.checkpoint_signing import key_store_url, sign_manifest

    source, _ = committed
    step_dir = tmp_path / "ck" / source.name
    shutil.copytree(source, step_dir)
    monkeypatch.delenv("STOKER_STORE_KEY", raising=False)
    monkeypatch.setenv("STOKER_KEY_DIR", str(tmp_path / "keys"))
    monkeypatch.setenv("STOKER_STORE", str(tmp_path / "a-store"))
    monkeypatch.setenv("STOKER_METRICS_STORE", f"file://{tmp_path}/run-store/")
    assert key_store_url() == str(tmp_path / "run-store")
    from stoker.store.signing import store_key

    store_key(key_store_url(), create=True)  # start_run made the run store's key on this machine
    store_key(str(tmp_path / "a-store"), create=True)  # ... and this machine has its own default store's
    manifest = json.loads((step_dir / MANIFEST).read_text())
    (step_dir / MANIFEST).write_text(json.dumps(sign_manifest(manifest)))  # the run store's key
    base, name = split(str(step_dir))
    assert verify(CkStore(base), name)["step"] == 2
    monkeypatch.delenv("STOKER_METRICS_STORE")  # a standalone reader: $STOKER_STORE's key
    with pytest.raises(CheckpointError, match=f"bad signature.*{tmp_path}/a-store.*the key file {tmp_path}/keys/"):
        verify(CkStore(base), name)
