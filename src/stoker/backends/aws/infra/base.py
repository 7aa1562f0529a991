"""What every resource kind shares: injected clients, the context of one plan/apply/destroy, AWS calls that
turn errors into messages, waiting with a timeout, and the Resource interface."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stoker.backends.aws.infra.config import InfraConfig
from stoker.backends.aws.infra.spec import PENDING, Facts, names
from stoker.backends.aws.infra.state import State
from stoker.backends.aws.session import aws_client, aws_error, error_code
from stoker.errors import BackendError

logger = logging.getLogger(__name__)
S3_ACTIONS = {"HeadBucket": "ListBucket", "GetPublicAccessBlock": "GetBucketPublicAccessBlock",
              "PutPublicAccessBlock": "PutBucketPublicAccessBlock", "PutBucketEncryption": "PutEncryptionConfiguration",
              "ListObjectVersions": "ListBucketVersions", "DeleteObjects": "DeleteObjectVersion"}


class Clients:
    """boto3 clients of one region, made once each. Tests inject `session` (event hooks) or `factory`."""

    def __init__(self, region: str | None = None, session: Any = None,
                 factory: Callable[[str], Any] | None = None) -> None:
        self.region = region
        self.session = session
        self.factory = factory
        self._made: dict[str, Any] = {}

    def __call__(self, service: str) -> Any:
        if service not in self._made:
            if self.factory:
                self._made[service] = self.factory(service)
            else:
                if self.session is None:  # one session: models and credentials load once
                    try:
                        import boto3

                        self.session = boto3.session.Session()
                    except ImportError:
                        pass  # aws_client says how to install it
                self._made[service] = aws_client(service, self.region, session=self.session)
        return self._made[service]

    @property
    def region_name(self) -> str:
        return self("sts").meta.region_name


@dataclass
class Context:
    cfg: InfraConfig
    clients: Clients
    state: State
    facts: Facts
    report: Callable[[str], None] = logger.info
    timeout: float = 900.0  # seconds any one wait may take
    poll: float = 5.0
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    warnings: list[str] = field(default_factory=list)

    @property
    def names(self) -> dict[str, str]:
        return names(self.cfg)

    def call(self, service: str, op: str, resource: str, *, missing: tuple[str, ...] = (), fix: str = "",
             **params: Any) -> Any:
        """`client.op(**params)`; None when AWS answers with an error code in `missing` (the thing is not
        there); any other failure a BackendError naming the call, the resource and the fix."""
        client = self.clients(service)
        try:
            return getattr(client, op)(**params)
        except BackendError:
            raise
        except Exception as e:
            if missing and (error_code(e) in missing or ("404" in missing and _status(e) == 404)):
                return None
            # named as the IAM action the caller needs (what AccessDenied asks for): service:Operation, except
            # for the S3 calls whose action has another name
            action = _camel(op)
            raise aws_error(e, f"{service}:{S3_ACTIONS.get(action, action) if service == 's3' else action}",
                            resource, fix) from e

    def wait(self, what: str, done: Callable[[], bool], fix: str, timeout: float | None = None) -> None:
        """Poll `done()` until it is true; a BackendError naming `what` and the fix after the timeout."""
        limit = self.timeout if timeout is None else timeout
        start = self.clock()
        while not done():
            if self.clock() - start > limit:
                raise BackendError(f"timed out after {limit:.0f}s waiting for {what}. Fix: {fix}")
            self.sleep(self.poll)

    def retry(self, what: str, fn: Callable[[], Any], codes: tuple[str, ...], fix: str,
              timeout: float | None = None, match: tuple[str, ...] = ()) -> Any:
        """`fn()`, retried while AWS answers with one of `codes` (and `match` in the message): IAM propagation,
        network interfaces still attached, instances still in a placement group. `match`: words one of which
        the message must hold (any case)."""
        limit = self.timeout if timeout is None else timeout
        start = self.clock()
        while True:
            try:
                return fn()
            except BackendError as e:
                code = error_code(e.__cause__) if e.__cause__ is not None else ""
                if code not in codes or (match and not any(m.lower() in str(e).lower() for m in match)):
                    raise
                if self.clock() - start > limit:
                    raise BackendError(f"{e} (still failing after {limit:.0f}s of retries while {what}; {fix})"
                                       ) from e.__cause__
                self.report(f"  waiting: {what} ({code})")
                self.sleep(self.poll)


def _camel(op: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in op.split("_"))


def _status(exc: BaseException) -> int:
    return int((getattr(exc, "response", None) or {}).get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def tag_dict(tags: Any) -> dict[str, str]:
    """Tags as a dict, from AWS's [{"Key", "Value"}] lists (any key case) or a dict."""
    if isinstance(tags, dict):
        return dict(tags)
    out = {}
    for t in tags or []:
        out[t.get("Key", t.get("key"))] = t.get("Value", t.get("value"))
    return out


@dataclass
class Actual:
    """What AWS has of one resource."""

    id: str
    arn: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)  # kind-specific (rules, versions, computeResources ...)


class Resource:
    """One kind of resource. Subclasses read (find by name), diff (desired vs actual), create, update, delete,
    and publish the ids later resources need into the context's facts."""

    key = ""
    kind = ""
    adoptable = False  # an existing resource that is not stoker's is used as is (bucket, repository, sg)
    keep_on_destroy = False
    use_note = "exists, not stoker's: used as is, never changed or deleted"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    @property
    def name(self) -> str:
        return self.ctx.names[self.key]

    @property
    def label(self) -> str:
        return f"{self.kind} {self.name}"

    def wanted(self) -> bool:
        return True

    def read(self) -> Actual | None:
        raise NotImplementedError

    def diff(self, actual: Actual) -> list[str]:
        return []

    def create(self) -> Actual:
        raise NotImplementedError

    def update(self, actual: Actual, diffs: list[str]) -> None:
        raise NotImplementedError

    def delete(self, actual: Actual, *, force: bool = False) -> None:
        raise NotImplementedError

    def publish(self, actual: Actual | None, changing: bool = False) -> None:
        """Put this resource's ids into the facts (PENDING when it does not exist yet, or when `changing`
        will give it a new id or version)."""

    def describe(self, actual: Actual) -> str:
        return actual.id

    def owned(self, actual: Actual) -> bool:
        """stoker's: tagged as this infra's, or recorded as created by stoker (same id) and carrying no other
        infra's tag (a bucket whose tagging call failed right after its creation)."""
        if actual.tags.get("stoker:infra") == self.ctx.cfg.name:
            return True
        rec = self.ctx.state.get(self.key) or {}
        return bool(rec.get("created_by_stoker") and "stoker:infra" not in actual.tags and rec.get("id") == actual.id)

    def record(self, actual: Actual, created: bool) -> None:
        self.ctx.state.record(self.key, kind=self.kind, name=self.name, id=actual.id, arn=actual.arn,
                              created_by_stoker=created)

    @staticmethod
    def pending(*values: str) -> bool:
        return any(v == PENDING for v in values)
