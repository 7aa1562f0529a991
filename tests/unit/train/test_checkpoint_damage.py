"""Issue 13: every way a committed checkpoint can be damaged, against every reader.

A real checkpoint folder (tiny Llama, steps 2, 4 and 5) is built once and copied per case; the newest one
(step 5) or the ``latest`` pointer is then damaged on purpose: truncated to half, one byte flipped, deleted,
or an extra file added. Readers: auto-resume, ``checkpoint.resume_from`` a step folder or a checkpoint folder,
the HF export and evaluate (a step folder or a folder), and the three command lines.
- a damaged shard, ``.metadata`` or ``manifest.json``: a step folder is refused with one line naming it; a
  folder falls back to step 4 with a warning naming step 5;
- an extra file in the checkpoint is never read: ignored with a warning naming it, step 5 is used;
- a damaged ``latest``: ignored with a warning, the newest valid checkpoint (step 5) is used;
- a manifest without its signature (an older stoker's), or signed with another key: like a damaged one;
- step 4's folder copied over step 5's (its signed manifest says step 4; issue 27): like a damaged one, with an
  older manifest (no `name`, no `directory`) too; an older manifest in its own folder is still loaded.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch

from stoker.errors import CheckpointError
from stoker.store.signing import SIGNATURE
from stoker.train import evaluate, hf
from stoker.train.__main__ import main as train_main
from stoker.train.checkpoint_signing import sign_manifest
from stoker.train.trainer import run_training

torch.set_num_threads(1)

STEP5, STEP4 = "step_00000005", "step_00000004"
FILES = {"shard": f"{STEP5}/__0_0.distcp", "metadata": f"{STEP5}/.metadata", "manifest": f"{STEP5}/manifest.json",
         "pointer": "latest", "folder": STEP5}
DAMAGES = [(t, k) for t in ("shard", "metadata", "manifest", "pointer") for k in ("truncated", "bitflip", "missing")]
DAMAGES += [("shard", "extra"), ("pointer", "extra"), ("manifest", "unsigned"), ("manifest", "other-key")]
DAMAGES += [("folder", "copied-over"), ("folder", "copied-older"), ("manifest", "older")]


def _as_older(path: Path) -> None:
    """The manifest as a stoker before issue 27 wrote it: no `name` or `directory` (signed all the same)."""
    manifest = json.loads(path.read_text())
    for key in (SIGNATURE, "name", "directory"):
        del manifest[key]
    path.write_text(json.dumps(sign_manifest(manifest)))


def _cfg(out: Path, tokens: Path, steps: int) -> dict:
    return {"out_dir": str(out), "data": {"url": str(tokens), "block_size": 33},
            "train": {"steps": steps, "micro_batch_size": 4, "lr": 3e-3, "log_every": 5},
            "checkpoint": {"every": 2}, "metrics": {"progress": False, "tensorboard": False}}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("damage")
    rng = np.random.default_rng(1)
    base = rng.integers(0, 256, size=97)
    tokens = root / "tokens.bin"
    np.concatenate([np.roll(base, i % 5) for i in range(22)]).astype(np.uint16).tofile(tokens)
    r = run_training(_cfg(root / "run", tokens, 5))
    ck = Path(r["checkpoint_dir"])
    assert sorted(p.name for p in ck.iterdir()) == ["latest", "step_00000002", STEP4, STEP5]
    return ck, tokens


def damage(ck: Path, target: str, kind: str) -> None:
    path = ck / FILES[target]
    if target == "folder":  # step 4's checkpoint copied over step 5's
        shutil.rmtree(path)
        shutil.copytree(ck / STEP4, path)
        if kind == "copied-older":
            _as_older(path / "manifest.json")
    elif kind == "older":
        _as_older(path)
    elif kind == "missing":
        path.unlink()
    elif kind in ("unsigned", "other-key"):
        manifest = json.loads(path.read_text())
        del manifest[SIGNATURE]
        if kind == "other-key":  # signed as stoker does, with the key of another store
            with mock.patch.dict(os.environ, {"STOKER_STORE_KEY": "another store's key"}):
                manifest = sign_manifest(manifest)
        path.write_text(json.dumps(manifest))
    elif kind == "extra":
        if target == "pointer":
            path.write_text(path.read_text() + "\n../../etc")
        else:
            (ck / STEP5 / "__9_0.distcp").write_bytes(b"not listed in the manifest")
    else:
        data = bytearray(path.read_bytes())
        if kind == "truncated":
            data = data[: len(data) // 2]
        elif target == "manifest":  # a flipped bit in a file's checksum (the rest of the manifest is metadata)
            at = data.index(b'"sha256": "') + len(b'"sha256": "')
            data[at] ^= 0x01
        elif target == "pointer":
            data[3] ^= 0x80  # not even UTF-8 any more
        else:
            data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))


def expected(target: str, kind: str) -> str | None:
    """The step a folder reader should use; None when the newest (step 5) must be refused."""
    return None if target in ("shard", "metadata", "manifest", "folder") and kind not in ("extra", "older") else STEP5


@pytest.fixture
def case(built, tmp_path, request) -> tuple[Path, Path]:
    ck, tokens = built
    copy = tmp_path / "run" / "checkpoints"
    shutil.copytree(ck, copy)
    damage(copy, *request.param)
    return copy, tokens


def _one_line(e: BaseException) -> str:
    text = str(e)
    assert "\n" not in text and STEP5 in text, text
    return text


READERS = ["auto", "resume_step", "resume_dir", "export_step", "export_dir", "evaluate_step", "evaluate_dir"]


# every (damage, reader) cell, except a damaged `latest` for readers given a step folder: they never read it
CELLS = [(d, r) for d in DAMAGES for r in READERS if not (r.endswith("_step") and d[0] == "pointer")]


@pytest.mark.parametrize("case, reader", CELLS, ids=[f"{t}-{k}-{r}" for (t, k), r in CELLS], indirect=["case"])
def test_every_reader_falls_back_or_refuses_in_one_line(case, reader, request, tmp_path, caplog):
    copy, tokens = case
    target, kind = request.node.callspec.params["case"]
    want = expected(target, kind)
    step_reader = reader.endswith("_step")
    source = str(copy / STEP5) if step_reader else str(copy)
    if step_reader and want is None:
        with pytest.raises(CheckpointError) as err:
            if reader == "resume_step":
                run_training(_cfg(tmp_path / "other", tokens, 6), resume_from=source)
            elif reader == "export_step":
                hf.export_from_checkpoint(source, tmp_path / "hf")
            else:
                evaluate.load_model(source)
        _one_line(err.value)
        assert target != "folder" or "holds the checkpoint of step 4, not of step 5" in str(err.value)
        assert not (tmp_path / "hf").exists()
        return
    want = want or STEP4
    if reader in ("auto", "resume_dir", "resume_step"):
        out = tmp_path / ("run" if reader == "auto" else "other")
        r = run_training(_cfg(out, tokens, 6), resume_from=None if reader == "auto" else source)
        assert r["resumed_from"].endswith(want) and r["step"] == 6
    else:
        _, weights, manifest = hf.load_checkpoint_weights(source, what=reader.split("_")[0])
        assert manifest["step"] == int(want[len("step_"):])
        if reader.startswith("evaluate"):
            model = evaluate.load_model(source)
            assert torch.equal(model.norm.weight, weights["norm.weight"])
        else:
            assert (hf.export_from_checkpoint(source, tmp_path / "hf") / "config.json").exists()
    if want == STEP4:
        assert f"skipping checkpoint {copy / STEP5}" in caplog.text
        if target == "folder":  # the real cause, named
            assert "holds the checkpoint of step 4, not of step 5" in caplog.text
    elif kind == "older":
        assert "skipping" not in caplog.text
    elif target == "shard":  # the extra file
        assert "__9_0.distcp" in caplog.text and "ignored" in caplog.text
    elif kind != "missing":  # a pointer that names no checkpoint: ignored, or the one it names is skipped
        assert "ignoring" in caplog.text or "skipping" in caplog.text


BAD = [d for d in DAMAGES if expected(*d) is None]


@pytest.mark.parametrize("cli", ["train", "export", "evaluate"])
@pytest.mark.parametrize("case", BAD, ids=[f"{t}-{k}" for t, k in BAD], indirect=True)
def test_command_lines_refuse_a_damaged_checkpoint_in_one_line(case, cli, tmp_path, capsys):
    copy, tokens = case
    step = str(copy / STEP5)
    if cli == "train":
        rc = train_main(["--data", str(tokens), "--set", "data.block_size=33", "--steps", "6",
                         "--micro-batch-size", "4", "--out-dir", str(tmp_path / "o"), "--resume-from", step,
                         "--set", "metrics.progress=false", "--set", "metrics.tensorboard=false"])
    elif cli == "export":
        rc = hf.main([step, str(tmp_path / "hf")])
    else:
        rc = evaluate.main([step, "--data", str(tmp_path / "no-data")])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert rc != 0 and "Traceback" not in err
    assert len(errors) == 1 and STEP5 in errors[0], err


@pytest.mark.slow
@pytest.mark.parametrize("module", ["stoker.train.hf", "stoker.train.evaluate"])
def test_the_real_commands_refuse_a_torn_shard(built, tmp_path, module):
    """The same through a real interpreter: exit code 1, one line on stderr, no traceback."""
    ck, _ = built
    copy = tmp_path / "checkpoints"
    shutil.copytree(ck, copy)
    damage(copy, "shard", "truncated")
    args = [str(tmp_path / "hf")] if module.endswith("hf") else ["--data", str(tmp_path / "none")]
    r = subprocess.run([sys.executable, "-m", module, str(copy / STEP5), *args], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and STEP5 in r.stderr, r.stderr
