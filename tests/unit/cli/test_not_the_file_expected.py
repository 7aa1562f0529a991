"""A file that is not what a command reads (a binary, garbage) is one error line naming it and the fix, with a
non-zero exit, never a traceback (issue 34 item 19): `stoker image render FILE`, `python -m stoker.train --config
FILE`, `python flow.py _task FILE`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.unit.cli.test_command_lines import error_shape

BINARY = b"\x7fELF\x02\x01\x01\x00\x00\x00\xff\xfe" * 20  # null bytes, and bytes that are not UTF-8
FLOW = "stoker.recipes.llama_pretrain"  # a flow run as `python -m`: `python flow.py COMMAND ...`

CASES = {
    "image render of a binary": (["stoker.cli.main", "image", "render", "{f}"], 1,
                                 "is not a Python source file that compiles: source code string cannot contain null"),
    "image render of a text file that is not Python": (["stoker.cli.main", "image", "render", "{t}"], 1,
                                                       "is not a Python source file that compiles: '{' was never "
                                                       "closed (line 1)"),
    "stoker.train --config of a binary": (["stoker.train", "--config", "{f}"], 78,
                                          "is not text (byte 10 is not UTF-8), so not a TOML file"),
    "_task of a binary": ([FLOW, "_task", "{f}"], 1, "not a task spec the scheduler wrote (UnicodeDecodeError"),
    "_task of garbage": ([FLOW, "_task", "{t}"], 1, "not a task spec the scheduler wrote (JSONDecodeError"),
    "_task of JSON that is no spec": ([FLOW, "_task", "{j}"], 1, "not a task spec the scheduler wrote (TypeError"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_file_of_the_wrong_kind_is_one_error_line(name, tmp_path):
    argv, code, text = CASES[name]
    (tmp_path / "blob.bin").write_bytes(BINARY)
    (tmp_path / "notes.txt").write_text("this is not python: {\n")
    (tmp_path / "other.json").write_text('{"not": "a spec"}')
    files = {"{f}": "blob.bin", "{t}": "notes.txt", "{j}": "other.json"}
    argv = [str(tmp_path / files[a]) if a in files else a for a in argv]
    env = {**os.environ, "STOKER_HOME": str(tmp_path / "home"), "COLUMNS": "100"}
    env.pop("STOKER_DEBUG", None)
    p = subprocess.run([sys.executable, "-m", *argv], cwd=tmp_path, env=env, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=240)
    shown = f"python -m {' '.join(argv)}\nexit {p.returncode}\nstdout: {p.stdout[-800:]}\nstderr: {p.stderr}"
    assert p.returncode == code, shown
    assert error_shape(p.stderr) is None, f"{error_shape(p.stderr)}\n{shown}"
    assert "Traceback" not in p.stdout + p.stderr and text in p.stderr, shown
