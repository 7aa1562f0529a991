"""The one way stoker makes an S3 client (blob store, datasets, corpora): boto3 with the usual AWS
credentials, ``$STOKER_S3_ENDPOINT_URL`` for MinIO / moto / other S3-compatible servers, and bounded
retries so that an unreachable endpoint fails in seconds, not after botocore's long legacy backoff."""

from __future__ import annotations

import os


def s3_client(error: type[Exception], what: str):
    """A boto3 S3 client; ``error(...)`` naming ``what`` and the fix when boto3 is missing."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise error(f"{what} needs boto3: pip install 'stoker[aws]'") from None
    config = Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=10, read_timeout=120)
    return boto3.client("s3", endpoint_url=os.environ.get("STOKER_S3_ENDPOINT_URL") or None, config=config)
