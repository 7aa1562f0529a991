"""The one way the AWS backend and `stoker infra` make boto3 clients, and turn AWS errors into messages.

Region: the argument, else `$STOKER_AWS_REGION`, `$AWS_REGION`, `$AWS_DEFAULT_REGION`, the profile's region.
Endpoints: boto3's own `$AWS_ENDPOINT_URL` / `$AWS_ENDPOINT_URL_<SERVICE>` (the tests point them at moto's server
on loopback). Retries are bounded ("standard" mode, 5 attempts), so an unreachable endpoint fails in seconds.
"""

from __future__ import annotations

import os
from typing import Any

from stoker.errors import BackendError, ConfigError

# what to do about the usual AWS errors (the code in the message is AWS's own)
FIXES = {
    "AccessDenied": "give the caller's IAM identity this permission (see docs/aws.md, 'Permissions')",
    "AccessDeniedException": "give the caller's IAM identity this permission (see docs/aws.md, 'Permissions')",
    "UnauthorizedOperation": "give the caller's IAM identity this permission (see docs/aws.md, 'Permissions')",
    "ExpiredToken": "refresh your AWS credentials (e.g. `aws sso login`)",
    "ExpiredTokenException": "refresh your AWS credentials (e.g. `aws sso login`)",
    "InvalidClientTokenId": "check AWS_ACCESS_KEY_ID / AWS_PROFILE: the credentials are not valid",
    "UnrecognizedClientException": "check AWS_ACCESS_KEY_ID / AWS_PROFILE: the credentials are not valid",
    "LimitExceededException": "ask for a higher quota (Service Quotas console) or remove unused resources",
    "VcpuLimitExceeded": "ask for a higher vCPU quota for this instance family (Service Quotas, EC2)",
    "Throttling": "too many calls: wait and retry, or poll less often (STOKER_BATCH_POLL_INTERVAL)",
    "ThrottlingException": "too many calls: wait and retry, or poll less often (STOKER_BATCH_POLL_INTERVAL)",
}


def region_name(region: str | None = None) -> str | None:
    return (region or os.environ.get("STOKER_AWS_REGION") or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION") or None)


def aws_client(service: str, region: str | None = None, session: Any = None) -> Any:
    """A boto3 client for `service` (ConfigError with the install command when boto3 is missing)."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise ConfigError(f"AWS {service} needs boto3: pip install 'stoker[aws]'") from None
    config = Config(retries={"mode": "standard", "max_attempts": 5}, connect_timeout=10, read_timeout=60)
    session = session or boto3.session.Session()
    name = region_name(region) or session.region_name
    if not name:
        raise ConfigError("no AWS region: set region in the infra TOML, STOKER_AWS_REGION or AWS_REGION "
                          "(e.g. export AWS_REGION=us-east-1)")
    return session.client(service, region_name=name, config=config)


def error_code(exc: BaseException) -> str:
    resp = getattr(exc, "response", None) or {}
    return str(resp.get("Error", {}).get("Code", "")) or type(exc).__name__


def aws_error(exc: BaseException, call: str, resource: str, fix: str = "") -> BackendError:
    """A BackendError naming the AWS call, the resource and the fix (AWS's own code and message kept)."""
    code = error_code(exc)
    resp = getattr(exc, "response", None) or {}
    detail = resp.get("Error", {}).get("Message") or str(exc)
    fix = fix or FIXES.get(code, "")
    if not fix and type(exc).__name__ in ("EndpointConnectionError", "ConnectTimeoutError", "NoCredentialsError"):
        fix = ("check network access to AWS and your credentials (AWS_PROFILE, or AWS_ACCESS_KEY_ID/"
               "AWS_SECRET_ACCESS_KEY), and AWS_ENDPOINT_URL if you use one")
    return BackendError(f"{call} on {resource} failed: {code}: {detail}" + (f". Fix: {fix}" if fix else ""))
