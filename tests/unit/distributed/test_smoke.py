"""`run --smoke` (stoker.distributed.smoke): gangs capped at 2 nodes and recorded, training commands shortened."""

from __future__ import annotations

import pytest

from stoker.distributed import smoke
from stoker.distributed.torchrun import TorchrunHelper, _flag_values
from stoker.errors import ConfigError
from stoker.store.blobs import open_store


def test_gangs_are_capped_only_in_a_smoke_run(tmp_path, monkeypatch, capsys):
    store = open_store(str(tmp_path / "store"))
    monkeypatch.delenv(smoke.ENV, raising=False)
    assert smoke.cap_gang(store, "F", "1", "train", 4) == 4
    monkeypatch.setenv(smoke.ENV, "1")
    assert smoke.cap_gang(store, "F", "1", "train", 1) == 1
    assert smoke.cap_gang(store, "F", "1", "train", 4) == 2
    assert smoke.cap_gang(store, "F", "1", "eval", 8) == 2
    assert smoke.read_record(store, "F", "1") == {"train": {"full": 4, "ran": 2}, "eval": {"full": 8, "ran": 2}}
    assert "gang train runs on 2 of its 4 nodes" in capsys.readouterr().out


def test_known_commands_are_shortened_and_others_refused(monkeypatch):
    nxd = {"max_steps": 10000, "steps_this_run": -1, "checkpoint_freq": 500, "lr": 3e-4}
    assert smoke.command_overrides("tp_zero1_llama_hf_pretrain.py", nxd, None) == {
        "max_steps": 20, "checkpoint_freq": 10, "steps_this_run": 20}
    assert smoke.command_overrides("train.py", ["--epochs", "3"], {"epochs": 1}) == {"epochs": 1}
    with pytest.raises(ConfigError, match=r"smoke=\{'max_steps'"):
        smoke.command_overrides("train.py", ["--epochs", "3"], None)
    monkeypatch.setenv(smoke.ENV, "1")
    helper = TorchrunHelper(nnodes=2, node_rank=0, master_addr="127.0.0.1", master_port=29500, nproc_per_node=1)
    flags = _flag_values(helper._smoke_args("x.py", nxd, None))
    assert (flags["--max_steps"], flags["--steps_this_run"], flags["--checkpoint_freq"], flags["--lr"]) == (
        "20", "20", "10", "0.0003")
    own = helper._smoke_args("stoker.train", ["--set=train.steps=10000"], None)
    assert own[-2:] == ["--set=train.steps=20", "--set=checkpoint.every=10"]  # the last --set wins
