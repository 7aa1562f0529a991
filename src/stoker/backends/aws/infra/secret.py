"""The Secrets Manager secret that holds the store's signing key (stoker.store.signing), for Batch nodes and
teammates: one per store (`stoker/<bucket>/<prefix>/store-key`), so every infra using the store finds it.

Created holding the key this machine already signs the store's runs with ($STOKER_STORE_KEY or its key file),
so existing runs stay readable, else a new random key. Batch jobs get its ARN (never the key) in
$STOKER_STORE_KEY_SECRET, and the job role may read exactly this secret. It protects the bucket's runs, so
`destroy` keeps it as long as it keeps the bucket; with `--delete-bucket` it is scheduled for deletion
(recoverable for 7 days, and a later `apply` restores it), with `--force` too it is deleted at once.
"""

from __future__ import annotations

import secrets

from stoker.backends.aws.infra.base import Actual, Context, Resource, tag_dict
from stoker.backends.aws.infra.spec import PENDING, tag_list, tags
from stoker.store.signing import local_key, remember_secret

RECOVERY_DAYS = 7  # the shortest recovery window Secrets Manager allows


class StoreKeySecret(Resource):
    key = "store_key_secret"
    kind = "Secrets Manager secret"
    adoptable = True  # made by another infra (a teammate's) on the same store, or by hand: its key is the key
    use_note = "exists, not stoker's: its key is used as is, never changed or deleted"

    def read(self) -> Actual | None:
        got = self.ctx.call("secretsmanager", "describe_secret", self.label, missing=("ResourceNotFoundException",),
                            SecretId=self.name)
        if got is None:
            return None
        return Actual(id=self.name, arn=got["ARN"], tags=tag_dict(got.get("Tags")),
                      data={"deleted": bool(got.get("DeletedDate"))})

    def diff(self, actual: Actual) -> list[str]:
        out = ["restore: scheduled for deletion"] if actual.data.get("deleted") else []
        missing = {k: v for k, v in tags(self.ctx.cfg).items() if actual.tags.get(k) != v}
        return out + (["tags " + ", ".join(sorted(missing))] if missing else [])

    def create(self) -> Actual:
        url = self.ctx.cfg.store_url
        have = local_key(url)
        key, source = (have[0].decode(), have[1]) if have else (secrets.token_hex(32), "a new random key")
        got = self.ctx.call("secretsmanager", "create_secret", self.label, Name=self.name, SecretString=key,
                            Description=f"stoker: the signing key of the store {url}", Tags=tag_list(self.ctx.cfg))
        actual = Actual(id=self.name, arn=got["ARN"], tags=tags(self.ctx.cfg))
        self.record(actual, created=True)
        self.ctx.report(f"  {self.label} holds {source}")
        return actual

    def update(self, actual: Actual, diffs: list[str]) -> Actual:
        for d in diffs:
            if d.startswith("restore"):
                self.ctx.call("secretsmanager", "restore_secret", self.label, SecretId=actual.arn)
                actual.data["deleted"] = False
            elif d.startswith("tags"):
                self.ctx.call("secretsmanager", "tag_resource", self.label, SecretId=actual.arn,
                              Tags=tag_list(self.ctx.cfg))
        return actual

    def delete(self, actual: Actual, *, force: bool = False) -> None:
        if force:
            self.ctx.call("secretsmanager", "delete_secret", self.label, missing=("ResourceNotFoundException",),
                          SecretId=actual.arn, ForceDeleteWithoutRecovery=True)
        elif not actual.data.get("deleted"):
            self.ctx.call("secretsmanager", "delete_secret", self.label, missing=("ResourceNotFoundException",),
                          SecretId=actual.arn, RecoveryWindowInDays=RECOVERY_DAYS)
            self.ctx.report(f"  {self.label}: recoverable for {RECOVERY_DAYS} days (`stoker infra apply` restores "
                            "it; `destroy --force` deletes it at once)")
        remember_secret(self.ctx.cfg.store_url, None)

    def publish(self, actual: Actual | None, changing: bool = False) -> None:
        self.ctx.facts.store_key_secret_arn = actual.arn if actual and actual.arn else PENDING

    def describe(self, actual: Actual) -> str:
        return (actual.arn or actual.id) + (" (scheduled for deletion)" if actual.data.get("deleted") else "")


def link_store_key(ctx: Context) -> None:
    """After apply: point this machine at the secret for the store's key (used where it has no key of its own),
    and warn when the key it signs with differs from the secret's, which Batch nodes and teammates use."""
    arn, url = ctx.facts.store_key_secret_arn, ctx.cfg.store_url
    if not arn or arn == PENDING:
        return
    remember_secret(url, arn)
    have = local_key(url)
    if have is None:
        ctx.report(f"  this machine signs runs in {url} with the key in {arn}")
        return
    value = ctx.call("secretsmanager", "get_secret_value", f"{StoreKeySecret.kind} {arn}", SecretId=arn)
    if (value.get("SecretString") or "").strip().encode() != have[0]:
        msg = (f"this machine signs runs in {url} with {have[1]}, which differs from the key in {arn} that Batch "
               f"nodes and teammates use: they cannot read what this machine signs, nor it theirs. Fix: use one key "
               f"(remove {have[1]} to use the secret's; runs signed with it then become unreadable)")
        ctx.warnings.append(msg)
        ctx.report(f"warning: {msg}")
