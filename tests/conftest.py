import os

import pytest

# One user for the whole session (module-scoped fixtures start runs before per-test fixtures apply).
os.environ.setdefault("USER", "tester")


@pytest.fixture(autouse=True)
def _stoker_home(tmp_path, monkeypatch):
    """Every test gets its own STOKER_HOME so runs, blobs and the metadata index never leak between tests."""
    home = tmp_path / "stoker_home"
    monkeypatch.setenv("STOKER_HOME", str(home))
    yield home
