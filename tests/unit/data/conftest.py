"""Small real corpora (cut from the built-in Shakespeare texts) in every supported file format."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from stoker.data.sources import shakespeare_files


@pytest.fixture(scope="session")
def docs() -> list[str]:
    """Twelve short real documents of different lengths."""
    out = []
    for i, path in enumerate(shakespeare_files()[:12]):
        text = path.read_text(encoding="utf-8")
        start = 3000 + 500 * i
        out.append(text[start:start + 400 + 150 * i].strip())
    return out


@pytest.fixture()
def jsonl_file(tmp_path: Path, docs) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)), encoding="utf-8")
    return path


@pytest.fixture()
def text_folder(tmp_path: Path, docs) -> Path:
    folder = tmp_path / "texts"
    folder.mkdir()
    for i, d in enumerate(docs):
        (folder / f"doc{i:02d}.txt").write_text(d, encoding="utf-8")
    return folder


@pytest.fixture()
def gz_jsonl(tmp_path: Path, docs) -> Path:
    path = tmp_path / "corpus.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    return path


@pytest.fixture()
def s3(moto_endpoint, monkeypatch):
    """The loopback S3 server, emptied, with one bucket ``data``; stoker finds it through
    STOKER_S3_ENDPOINT_URL. Yields a boto3 client for it."""
    import urllib.request

    boto3 = pytest.importorskip("boto3")
    urllib.request.urlopen(urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST"))
    for var, value in {"STOKER_S3_ENDPOINT_URL": moto_endpoint, "AWS_ACCESS_KEY_ID": "test",
                       "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(var, value)
    client = boto3.client("s3", endpoint_url=moto_endpoint)
    client.create_bucket(Bucket="data")
    return client
