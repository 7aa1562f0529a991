import os

import pytest

# One user for the whole session (module-scoped fixtures start runs before per-test fixtures apply).
os.environ.setdefault("USER", "tester")
# One store signing key for the session (as a cluster shares one): no key files in the real ~/.config, and
# emulated remote nodes get it as Batch would pass it (from a secret); tests of key files unset it.
os.environ.setdefault("STOKER_STORE_KEY", "test-store-key")


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


@pytest.fixture(scope="session")
def moto_endpoint():
    """A real AWS API server (moto: S3, Batch, EC2, IAM, CloudWatch Logs, ECR, SSM ...) on loopback, for the
    whole session."""
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


class AwsStandIn:
    """The loopback AWS of one test: `client(service)` makes boto3 clients for it; every boto3 client stoker
    makes reaches it too (AWS_ENDPOINT_URL, STOKER_S3_ENDPOINT_URL)."""

    region = "us-east-1"

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    def client(self, service: str):
        import boto3

        return boto3.client(service, region_name=self.region, endpoint_url=self.endpoint)


@pytest.fixture()
def aws(moto_endpoint, monkeypatch):
    """moto's server emptied, and this process's AWS settings pointed at it (fake credentials)."""
    import urllib.request

    pytest.importorskip("boto3")
    urllib.request.urlopen(urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST"))
    # moto's Batch without docker: jobs are accepted and described, never run (tests/batch_emulator.py runs them)
    urllib.request.urlopen(urllib.request.Request(f"{moto_endpoint}/moto-api/config", method="POST",
                                                  data=b'{"batch": {"use_docker": false}}'))
    for var, value in {"AWS_ENDPOINT_URL": moto_endpoint, "STOKER_S3_ENDPOINT_URL": moto_endpoint,
                       "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                       "AWS_DEFAULT_REGION": AwsStandIn.region, "AWS_REGION": AwsStandIn.region}.items():
        monkeypatch.setenv(var, value)
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "STOKER_AWS_REGION"):
        monkeypatch.delenv(var, raising=False)
    return AwsStandIn(moto_endpoint)
