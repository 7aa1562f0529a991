"""`stoker data prepare|train-tokenizer` through argparse and `python -m stoker.data` in a subprocess."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from stoker.cli.data import main, register
from stoker.data import open_dataset


def test_register_adds_data_command(tmp_path, jsonl_file, capsys):
    parser = argparse.ArgumentParser(prog="stoker")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["data", "prepare", str(jsonl_file), "-b", "32", "-o", str(tmp_path / "d"), "--json",
                              "--val-fraction", "0"])
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["url"] == str(tmp_path / "d") and out["block_size"] == 32 and out["splits"] == ["train"]
    assert len(open_dataset(out["url"])) == out["num_tokens"] // 32


def test_train_tokenizer_then_prepare_with_it(tmp_path, text_folder, capsys):
    assert main(["train-tokenizer", str(text_folder), "-o", str(tmp_path / "tok"), "--vocab-size", "300",
                 "--min-frequency", "1"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "tok" / "tokenizer.json")
    assert main(["prepare", str(text_folder), "-t", str(tmp_path / "tok"), "-b", "16", "-q",
                 "-o", str(tmp_path / "d")]) == 0
    ds = open_dataset(tmp_path / "d")
    assert ds.vocab_size == 300 and ds.manifest["tokenizer"]["kind"] == "tokenizers" and ds[0][0] == 1


def test_module_entry_point_and_clean_errors(tmp_path, jsonl_file):
    env = {**os.environ, "STOKER_HOME": str(tmp_path / "home")}
    ok = subprocess.run([sys.executable, "-m", "stoker.data", "prepare", str(jsonl_file), "-b", "32", "-q"],
                        capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0, ok.stderr
    url = ok.stdout.strip()
    assert url.startswith(str(tmp_path / "home" / "datasets")) and os.path.isfile(os.path.join(url, "manifest.json"))
    bad = subprocess.run([sys.executable, "-m", "stoker.data", "prepare", str(jsonl_file), "--text-field", "body"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "error: " in bad.stderr and "corpus.jsonl:1: no text field 'body'" in bad.stderr


def test_stoker_cli_wires_data_command(tmp_path, jsonl_file, capsys):
    import pytest

    from stoker.cli.main import main as stoker_main

    with pytest.raises(SystemExit) as done:
        stoker_main(["data", "prepare", str(jsonl_file), "-b", "32", "-q", "-o", str(tmp_path / "d")])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == str(tmp_path / "d")
