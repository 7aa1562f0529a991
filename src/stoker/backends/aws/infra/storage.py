"""The S3 bucket of the store and the ECR repository of the images."""

from __future__ import annotations

from typing import Any

from stoker.backends.aws.infra.base import Actual, Resource, tag_dict
from stoker.backends.aws.infra.spec import PENDING, tag_list, tags
from stoker.backends.aws.session import error_code
from stoker.errors import BackendError

PUBLIC_ACCESS_BLOCK = {"BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True,
                       "RestrictPublicBuckets": True}


class Bucket(Resource):
    """The store's bucket. An existing bucket that is not stoker's is used as is, and never deleted; stoker's
    own is deleted only with `destroy --delete-bucket` (it holds every run's artifacts)."""

    key = "bucket"
    kind = "S3 bucket"
    adoptable = True

    def read(self) -> Actual | None:
        fix = ("bucket names are global: if another account owns it, choose another bucket in the TOML; "
               "else give the caller s3:ListBucket on it")
        head = self.ctx.call("s3", "head_bucket", self.label, missing=("404", "NoSuchBucket", "NotFound"),
                             fix=fix, Bucket=self.name)
        if head is None:
            return None
        region = head.get("BucketRegion") or head.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get(
            "x-amz-bucket-region")
        # AccessDenied: a bucket of someone else's that we may use but not inspect; stoker's own answer
        got = self.ctx.call("s3", "get_bucket_tagging", self.label, missing=("NoSuchTagSet", "AccessDenied"),
                            Bucket=self.name)
        actual = Actual(id=self.name, arn=f"arn:{self.ctx.facts.partition}:s3:::{self.name}",
                        tags=tag_dict((got or {}).get("TagSet")), data={"region": region})
        if self.owned(actual):
            pab = self.ctx.call("s3", "get_public_access_block", self.label,
                                missing=("NoSuchPublicAccessBlockConfiguration",), Bucket=self.name)
            ver = self.ctx.call("s3", "get_bucket_versioning", self.label, Bucket=self.name)
            actual.data.update(public_access=(pab or {}).get("PublicAccessBlockConfiguration", {}),
                               versioning=ver.get("Status", "Off"))
        return actual

    def diff(self, actual: Actual) -> list[str]:
        out = []
        if any(actual.data.get("public_access", {}).get(k) is not True for k in PUBLIC_ACCESS_BLOCK):
            out.append("block all public access")
        if self.ctx.cfg.bucket_versioning and actual.data.get("versioning") != "Enabled":
            out.append(f"versioning {actual.data.get('versioning')} -> Enabled")
        missing = {k: v for k, v in tags(self.ctx.cfg).items() if actual.tags.get(k) != v}
        if missing:
            out.append("tags " + ", ".join(sorted(missing)))
        return out

    def create(self) -> Actual:
        region = self.ctx.facts.region
        params: dict[str, Any] = {"Bucket": self.name}
        if region != "us-east-1":  # us-east-1 refuses its own name as a location constraint
            params["CreateBucketConfiguration"] = {"LocationConstraint": region}
        self.ctx.call("s3", "create_bucket", self.label,
                      fix="bucket names are global: choose another bucket in the TOML if it is taken", **params)
        actual = Actual(id=self.name, arn=f"arn:{self.ctx.facts.partition}:s3:::{self.name}")
        self.record(actual, created=True)
        self.ctx.call("s3", "put_bucket_tagging", self.label, Bucket=self.name,
                      Tagging={"TagSet": tag_list(self.ctx.cfg)})
        self.ctx.call("s3", "put_public_access_block", self.label, Bucket=self.name,
                      PublicAccessBlockConfiguration=PUBLIC_ACCESS_BLOCK)
        self.ctx.call("s3", "put_bucket_encryption", self.label, Bucket=self.name,
                      ServerSideEncryptionConfiguration={"Rules": [
                          {"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"},
                           "BucketKeyEnabled": True}]})
        if self.ctx.cfg.bucket_versioning:
            self._versioning()
        return actual

    def _versioning(self) -> None:
        self.ctx.call("s3", "put_bucket_versioning", self.label, Bucket=self.name,
                      VersioningConfiguration={"Status": "Enabled"})

    def update(self, actual: Actual, diffs: list[str]) -> Actual:
        for d in diffs:
            if d.startswith("block"):
                self.ctx.call("s3", "put_public_access_block", self.label, Bucket=self.name,
                              PublicAccessBlockConfiguration=PUBLIC_ACCESS_BLOCK)
            elif d.startswith("versioning"):
                self._versioning()
            elif d.startswith("tags"):
                self.ctx.call("s3", "put_bucket_tagging", self.label, Bucket=self.name,
                              Tagging={"TagSet": [{"Key": k, "Value": v} for k, v in
                                                  sorted({**actual.tags, **tags(self.ctx.cfg)}.items())]})
        return actual

    def delete(self, actual: Actual, *, force: bool = False) -> None:
        """Empty the bucket (every object version and delete marker), then delete it."""
        params: dict[str, Any] = {"Bucket": self.name}
        while True:
            page = self.ctx.call("s3", "list_object_versions", self.label, missing=("NoSuchBucket",), **params)
            if page is None:
                return
            keys = [{"Key": o["Key"], "VersionId": o["VersionId"]}
                    for o in page.get("Versions", []) + page.get("DeleteMarkers", [])]
            if keys:
                self.ctx.call("s3", "delete_objects", self.label, Bucket=self.name,
                              Delete={"Objects": keys, "Quiet": True})
            if not page.get("IsTruncated"):
                break
            params.update(KeyMarker=page["NextKeyMarker"], VersionIdMarker=page["NextVersionIdMarker"])
        self.ctx.call("s3", "delete_bucket", self.label, missing=("NoSuchBucket",), Bucket=self.name)

    def describe(self, actual: Actual) -> str:
        region = actual.data.get("region")
        return f"s3://{self.name}/{self.ctx.cfg.prefix}" + (f" ({region})" if region else "")


class Repository(Resource):
    """The ECR repository `stoker image` pushes to (scan on push). An existing one is used as is."""

    key = "ecr_repository"
    kind = "ECR repository"
    adoptable = True

    def read(self) -> Actual | None:
        got = self.ctx.call("ecr", "describe_repositories", self.label, missing=("RepositoryNotFoundException",),
                            repositoryNames=[self.name])
        if not got or not got.get("repositories"):
            return None
        repo = got["repositories"][0]
        t = self.ctx.call("ecr", "list_tags_for_resource", self.label, resourceArn=repo["repositoryArn"])
        return Actual(id=self.name, arn=repo["repositoryArn"], tags=tag_dict(t.get("tags")),
                      data={"uri": repo["repositoryUri"],
                            "scan": repo.get("imageScanningConfiguration", {}).get("scanOnPush", False)})

    def diff(self, actual: Actual) -> list[str]:
        return [] if actual.data.get("scan") else ["scan on push: off -> on"]

    def create(self) -> Actual:
        got = self.ctx.call("ecr", "create_repository", self.label, repositoryName=self.name,
                            imageScanningConfiguration={"scanOnPush": True}, imageTagMutability="MUTABLE",
                            tags=tag_list(self.ctx.cfg))["repository"]
        actual = Actual(id=self.name, arn=got["repositoryArn"], data={"uri": got["repositoryUri"], "scan": True})
        self.record(actual, created=True)
        return actual

    def update(self, actual: Actual, diffs: list[str]) -> Actual:
        self.ctx.call("ecr", "put_image_scanning_configuration", self.label, repositoryName=self.name,
                      imageScanningConfiguration={"scanOnPush": True})
        return actual

    def delete(self, actual: Actual, *, force: bool = False) -> None:
        try:
            self.ctx.call("ecr", "delete_repository", self.label, missing=("RepositoryNotFoundException",),
                          repositoryName=self.name, force=force)
        except BackendError as e:
            if e.__cause__ is not None and error_code(e.__cause__) == "RepositoryNotEmptyException":
                raise BackendError(f"ecr:DeleteRepository on {self.label} failed: it still holds images. Fix: "
                                   "`stoker infra destroy --force` deletes them with the repository") from e
            raise

    def publish(self, actual: Actual | None, changing: bool = False) -> None:
        self.ctx.facts.ecr_uri = actual.data["uri"] if actual else PENDING

    def describe(self, actual: Actual) -> str:
        return actual.data.get("uri", actual.id)
