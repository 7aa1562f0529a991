"""prepare()'s progress line (files done/total, input MB/s, tokens/s) and the read statistics behind it."""

from __future__ import annotations

import io
import re

from rich.console import Console

from stoker.data import prepare


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=300, force_terminal=False, color_system=None), buf


def test_progress_line_shows_files_mb_per_s_and_tokens_per_s(tmp_path, text_folder):
    console, buf = _console()
    ref = prepare(str(text_folder), block_size=32, val_fraction=0, output=str(tmp_path / "ds"), progress=True,
                  console=console, batch_chars=2000)  # several batches: the line is updated along the way
    out = buf.getvalue()
    line = next(ln for ln in out.splitlines() if "tokenizing" in ln)
    assert "files 12/12" in line
    assert re.search(r"[\d.]+ MB/s", line) and re.search(r"[\d,]+ tokens \([\d,]+ tok/s\)", line)
    assert "12 docs" in line
    stats = ref.manifest["stats"]
    on_disk = sum(p.stat().st_size for p in text_folder.iterdir())
    assert stats["files"] == 12 and stats["bytes_read"] == on_disk and stats["mb_per_s"] > 0
    assert f"{stats['documents']} docs" in out and "dataset " + ref.fingerprint in out  # the summary follows


def test_compressed_input_counts_bytes_on_disk(tmp_path, gz_jsonl):
    console, buf = _console()
    ref = prepare(str(gz_jsonl), block_size=32, val_fraction=0, output=str(tmp_path / "ds"), progress=True,
                  console=console)
    stats = ref.manifest["stats"]
    assert stats["files"] == 1 and stats["bytes_read"] == gz_jsonl.stat().st_size  # compressed bytes read
    assert "files 1/1" in buf.getvalue()


def test_no_progress_prints_nothing_and_a_second_read_counts_from_zero(tmp_path, jsonl_file):
    from stoker.data.sources import resolve_source

    src = resolve_source(str(jsonl_file))
    list(src.documents())  # read once before: the counters of the next prepare start from there
    console, buf = _console()
    ref = prepare(src, block_size=32, val_fraction=0, output=str(tmp_path / "ds"), progress=False, console=console)
    assert buf.getvalue() == ""
    assert ref.manifest["stats"]["files"] == 1
    assert ref.manifest["stats"]["bytes_read"] == jsonl_file.stat().st_size
