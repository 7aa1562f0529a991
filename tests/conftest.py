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


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A real 3-node Slurm cluster on localhost (tests/slurm_cluster.py), SLURM_CONF set for the session."""
    from tests.slurm_cluster import SlurmCluster, available

    if reason := available():
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Slurm tests: {reason}", pytrace=False)
        pytest.skip(reason)
    old = os.environ.get("SLURM_CONF")
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as cluster:
        os.environ["SLURM_CONF"] = str(cluster.conf_path)
        try:
            yield cluster
        finally:
            if old is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = old
