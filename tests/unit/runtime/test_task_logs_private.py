"""Task logs (issue 13): never in a predictable shared folder, never written through a planted symlink."""

from __future__ import annotations

import os
import stat
import tempfile

import pytest

from stoker.flow.graph import FlowGraph
from stoker.runtime.driver.context import RunContext
from stoker.runtime.driver.output import TaskOutput
from stoker.runtime.driver.scheduler import Scheduler
from stoker.store.blobs import open_store
from stoker.store.metadata import MetadataDB
from tests.helpers import FLOWS


def _sleepy_flow():
    import importlib.util

    spec = importlib.util.spec_from_file_location("sleepy_flow_for_logs", FLOWS / "sleepy_flow.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.SleepyFlow


def test_default_log_root_is_private_and_ignores_a_planted_old_path(tmp_path, monkeypatch):
    """Another user's symlink at the old predictable path (<tmp>/stoker-logs) must not receive our logs."""
    shared_tmp, victim = tmp_path / "shared_tmp", tmp_path / "victim"
    shared_tmp.mkdir()
    victim.mkdir()
    (shared_tmp / "stoker-logs").symlink_to(victim)
    monkeypatch.setenv("TMPDIR", str(shared_tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(shared_tmp))
    flow_cls = _sleepy_flow()
    sched = Scheduler(RunContext(flow_cls=flow_cls, graph=FlowGraph(flow_cls), run_id="1",
                                 store=open_store(str(tmp_path / "s")), db=MetadataDB(tmp_path / "db.sqlite"),
                                 router=lambda step: None, run_inputs={}, user="u"))
    root = sched.log_root
    assert root.resolve() != (shared_tmp / "stoker-logs").resolve() and not root.is_symlink()
    st = os.lstat(root)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
    out = TaskOutput(root / "SleepyFlow" / "1" / "start" / "1.0", "1/start/1")
    out.feed("stdout", b"secret line\n")
    out.close()
    assert list(victim.iterdir()) == []


def test_task_log_files_are_not_opened_through_symlinks(tmp_path):
    log_dir, victim = tmp_path / "logs" / "t.0", tmp_path / "victim.txt"
    log_dir.mkdir(parents=True)
    victim.write_text("keep me\n")
    (log_dir / "stdout.log").symlink_to(victim)
    with pytest.raises(OSError, match="symlink"):
        TaskOutput(log_dir, "p")
    assert victim.read_text() == "keep me\n"
    # a symlinked attempt folder is refused too
    real = tmp_path / "elsewhere"
    real.mkdir()
    (tmp_path / "logs" / "t.1").symlink_to(real, target_is_directory=True)
    with pytest.raises(OSError, match="symlink"):
        TaskOutput(tmp_path / "logs" / "t.1", "p")
    assert list(real.iterdir()) == []
    # the ordinary case: files created 0600
    out = TaskOutput(tmp_path / "logs" / "t.2", "p")
    assert out.feed("stdout", b"a\nb") == ["a"]
    out.close()
    assert (tmp_path / "logs" / "t.2" / "stdout.log").read_bytes() == b"a\nb"
    assert stat.S_IMODE(os.stat(tmp_path / "logs" / "t.2" / "stdout.log").st_mode) == 0o600
