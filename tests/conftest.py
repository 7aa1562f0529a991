import os

import pytest


@pytest.fixture(autouse=True)
def _stoker_home(tmp_path, monkeypatch):
    """Every test gets its own STOKER_HOME so runs, blobs and the metadata index never leak between tests."""
    home = tmp_path / "stoker_home"
    monkeypatch.setenv("STOKER_HOME", str(home))
    monkeypatch.setenv("USER", os.environ.get("USER", "tester"))
    yield home
