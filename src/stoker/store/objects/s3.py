"""``s3://bucket/prefix`` through boto3: AWS, MinIO or any S3 API (``$STOKER_S3_ENDPOINT_URL``).

The only place stoker makes an S3 client (:func:`s3_client`) and turns botocore failures into messages
(:func:`s3_errors`). Objects of at least ``multipart_threshold`` bytes go up as a multipart upload whose
parts are sent ``concurrency`` at a time (read with ``pread``, so no part is copied twice), and come down
as that many ranged GETs written with ``pwrite`` into a preallocated file; every ranged GET names the ETag
seen first (``IfMatch``), so an object replaced mid-download fails instead of mixing two versions.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from stoker._hashing import SHA256, key_algo, key_of
from stoker.errors import StokerError, StoreError
from stoker.store.objects.base import MiB, ObjectInfo, ObjectStore, TransferConfig, Upload, check_object_key
from stoker.store.objects.prefix_hash import PrefixHash

_MAX_PARTS = 10_000  # S3's limit per multipart upload
_CHUNK = 1 * MiB  # bytes per read of a streamed response


def s3_client(error: type[StokerError] = StoreError, what: str = "s3:// storage",
              config: TransferConfig | None = None) -> Any:
    """A boto3 S3 client: the usual AWS credentials (or ``profile``), ``endpoint_url`` for S3-compatible
    servers, bounded retries (an unreachable endpoint fails in seconds) and a connection pool as large as
    the transfer concurrency. ``error(...)`` naming ``what`` and the fix when boto3 is missing."""
    config = config or TransferConfig.from_env()
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise error(f"{what} needs boto3: pip install 'stoker[aws]'") from None
    try:
        session = boto3.session.Session(profile_name=config.profile, region_name=config.region)
    except Exception as e:  # botocore.exceptions.ProfileNotFound
        raise error(f"{what}: AWS profile {config.profile!r} (STOKER_S3_PROFILE) is unusable: {e}; "
                    "name a profile of ~/.aws/config or unset STOKER_S3_PROFILE") from None
    # Bodies are not SHA256-signed (UNSIGNED-PAYLOAD; the CRC32 checksum header, which is signed, covers them),
    # as botocore already does over https: over plain http (MinIO on a private network) it would otherwise
    # hash every byte once more (~0.6 CPU-s per GB here; 8 cores at 100 Gbps). What stoker reads back is
    # checked against the sha256 its signed records hold, whatever the transport. So is a GET: botocore's own
    # response check (a CRC32 of the whole object, asked for with every GET) is left to requests that ask for it,
    # since servers that answer a ranged GET with the whole object's checksum (rclone's) would fail every
    # range, and stoker fetches large objects as ranges.
    boto_config = Config(retries={"mode": "standard", "max_attempts": config.max_attempts},
                         connect_timeout=config.connect_timeout, read_timeout=config.read_timeout,
                         max_pool_connections=max(10, 2 * config.concurrency),
                         s3={"payload_signing_enabled": False}, response_checksum_validation="when_required")
    return session.client("s3", endpoint_url=config.endpoint_url, config=boto_config)


_LIVE: weakref.WeakSet = weakref.WeakSet()  # every S3Objects of this process (a forked child resets them)


def drop_connections(client: Any) -> None:
    """Close ``client``'s pooled connections on this side (a forked child: its parent keeps its own, and both
    reading one TLS stream would mix their replies); the client opens new ones at its next request."""
    try:
        client._endpoint.http_session.close()
    except Exception:  # noqa: BLE001 - another client (a test's stand-in): nothing pooled to drop
        pass


def _after_fork_in_child() -> None:
    """A forked member inherits the run's stores: new connections (not the parent's sockets) and transfer slots
    (a slot a parent's thread held when it forked would never be released here)."""
    for store in list(_LIVE):
        store._slots = threading.BoundedSemaphore(store.config.concurrency)
        drop_connections(store.client)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def error_code(err: BaseException) -> str:
    return str(getattr(err, "response", {}).get("Error", {}).get("Code", ""))


def is_missing(err: BaseException) -> bool:
    return error_code(err) in ("404", "NoSuchKey", "NotFound")


def is_boto_error(err: BaseException) -> bool:
    return type(err).__module__.startswith(("botocore", "boto3", "s3transfer", "urllib3"))


@contextlib.contextmanager
def s3_errors(what: str, url: str, error: type[StokerError] = StoreError) -> Iterator[None]:
    """Turn botocore failures into ``error`` saying what was being done and how to fix it."""
    try:
        yield
    except StokerError:
        raise
    except Exception as e:  # botocore raises many unrelated classes
        if is_boto_error(e):
            raise error(f"{url}: {what} failed: {e}. Check the bucket exists, your AWS credentials, and "
                        "STOKER_S3_ENDPOINT_URL when using an S3-compatible server") from None
        raise


class S3Objects(ObjectStore):
    """Objects under ``s3://bucket/prefix``; ``client`` is a boto3 S3 client (made by :func:`s3_client`
    if omitted)."""

    def __init__(self, bucket: str, prefix: str = "", *, client: Any = None, error: type[StokerError] = StoreError,
                 config: TransferConfig | None = None) -> None:
        if not bucket:
            raise error("an S3 URL needs a bucket: s3://bucket/prefix")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.error = error
        self.config = config or TransferConfig.from_env()
        self.client = client if client is not None else s3_client(error, self.url, self.config)
        # parts and ranges in flight across every transfer of this store: ``put_many`` of large files (each a
        # parallel multipart upload) and concurrent streamed uploads share ``concurrency`` slots, so memory and
        # connections stay at ``concurrency`` parts however transfers nest. Only leaf requests take a slot.
        self._slots = threading.BoundedSemaphore(self.config.concurrency)
        _LIVE.add(self)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> S3Objects:
        if not url.startswith("s3://"):
            raise kwargs.get("error", StoreError)(f"{url!r} is not an s3:// URL")
        bucket, _, prefix = url[len("s3://"):].partition("/")
        return cls(bucket, prefix, **kwargs)

    def s3key(self, key: str) -> str:
        check_object_key(key, self.error)
        return f"{self.prefix}/{key}" if self.prefix and key else (key or self.prefix)

    def _errors(self, what: str, key: str) -> contextlib.AbstractContextManager[None]:
        return s3_errors(what, self.url_of(key), self.error)

    # --- existence ----------------------------------------------------------------------------------
    def absent(self, err: BaseException, s3key: str) -> bool:
        """Is ``s3key`` missing? S3 answers 403, not 404, for a missing key to a caller who may read objects but
        not list the whole bucket (a job role limited to a prefix): a listing of the key settles it."""
        if is_missing(err):
            return True
        if error_code(err) not in ("403", "AccessDenied", "Forbidden"):
            return False
        try:
            found = self.client.list_objects_v2(Bucket=self.bucket, Prefix=s3key, MaxKeys=1).get("Contents", [])
        except Exception:  # noqa: BLE001 - cannot list either: it is a real permission problem
            return False
        return not any(o.get("Key") == s3key for o in found)

    def head(self, key: str) -> dict[str, Any] | None:
        s3key = self.s3key(key)
        try:
            return self.client.head_object(Bucket=self.bucket, Key=s3key)
        except Exception as e:
            if self.absent(e, s3key):
                return None
            with self._errors("checking", key):
                raise

    def size(self, key: str) -> int | None:
        head = self.head(key)
        return None if head is None else int(head["ContentLength"])

    # --- small objects ----------------------------------------------------------------------------------
    def put_bytes(self, key: str, data: bytes | memoryview, *, durable: bool = False,
                  readonly: bool = False) -> None:
        view = memoryview(data).cast("B")
        if view.nbytes >= self.config.multipart_threshold:
            self._multipart(key, view.nbytes, lambda off, n: bytes(view[off:off + n]))
            return
        with self._errors("writing", key):
            self.client.put_object(Bucket=self.bucket, Key=self.s3key(key), Body=bytes(view))

    def _get(self, key: str, **kwargs: Any) -> Any:
        s3key = self.s3key(key)
        try:
            return self.client.get_object(Bucket=self.bucket, Key=s3key, **kwargs)
        except Exception as e:
            if self.absent(e, s3key):
                raise self.missing(key) from None
            with self._errors("reading", key):
                raise

    def _first_part(self, key: str) -> tuple[Any, int] | None:
        """(reply, object size) of a GET of the first part of ``key``, None when it does not exist: one request
        serves a small object whole and tells the size of a large one."""
        try:
            resp = self._get(key, Range=f"bytes=0-{self._part_size(0) - 1}")
        except self.error as e:
            if isinstance(e.__context__, Exception) and error_code(e.__context__) == "InvalidRange":  # empty
                resp = self._get(key)
            elif not self.exists(key):
                return None
            else:
                raise
        total = str(resp.get("ContentRange", "")).rpartition("/")[2]
        return resp, int(total) if total.isdigit() else int(resp.get("ContentLength", 0))

    def try_get_bytes(self, key: str) -> bytes | None:
        """One GET of the first part; the rest of a large object (its size is in the reply) as parallel ranges."""
        found = self._first_part(key)
        if found is None:
            return None
        resp, total = found
        return bytes(self._land(key, resp, total, bytearray(total))[0])

    def get_buffer(self, key: str, *, sha256: str | None = None, size: int | None = None) -> bytes | memoryview:
        """A large object lands in private anonymous memory and is handed over as it is: no zeroing pass before
        the download and no copy into ``bytes`` after it (each costs about as much as the download itself here,
        on fresh pages). Its sha256 is computed while the parts land; a wrong size is refused after the first
        GET, before the rest is downloaded."""
        found = self._first_part(key)
        if found is None:
            raise self.missing(key)
        resp, total = found
        if size is not None and total != size:
            resp["Body"].close()
            raise self.wrong_size(key, total, size)
        if total <= self._part_size(0):  # one GET had it all
            return self.verified(key, bytes(self._land(key, resp, total, bytearray(total))[0]), sha256)
        area = mmap.mmap(-1, total, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        algo = key_algo(sha256) or SHA256
        view, got = self._land(key, resp, total, area, hashed=sha256 is not None, algo=algo)
        if sha256 is not None and key_of(algo, str(got)) != sha256:
            raise self.corrupt(key, key_of(algo, str(got)), sha256)
        return view.toreadonly()

    def _land(self, key: str, resp: Any, total: int, area: Any, *, hashed: bool = False,
              algo: str = SHA256) -> tuple[memoryview, str | None]:
        """The object (``resp``: its first GET) downloaded into the writable buffer ``area`` of ``total`` bytes,
        and with ``hashed`` its hex digest (``algo``), computed while the parts land."""
        view = memoryview(area)
        hasher = PrefixHash(total, lambda off, n: view[off:off + n], algo) if hashed else None

        def write(off: int, chunk: bytes) -> None:
            view[off:off + len(chunk)] = chunk
            if hasher is not None:
                hasher.landed(off, len(chunk))

        try:
            self._fill(key, resp, total, write)
        except BaseException:
            if hasher is not None:
                hasher.stop()
            raise
        return view, hasher.hexdigest() if hasher is not None else None

    def _fill(self, key: str, resp: Any, size: int, write: Callable[[int, bytes], None]) -> None:
        """Stream the reply to the first GET (:meth:`_first_part`) into ``write`` while the other parts of a
        large object come down in parallel ranged GETs."""
        head = min(size, self._part_size(0))  # what the first GET returns
        rest: Future | None = None
        if head < size:
            pool = ThreadPoolExecutor(1, thread_name_prefix="stoker-download")
            rest = pool.submit(self._ranged, key, size, str(resp.get("ETag", "")), write, head)
            pool.shutdown(wait=False)
        got = 0
        try:
            with self._errors("downloading", key):
                body = resp["Body"]
                while chunk := body.read(_CHUNK):
                    write(got, chunk)
                    got += len(chunk)
        finally:
            failed = rest.exception() if rest is not None else None  # waits: nobody writes after we return
        if failed is not None:
            raise failed
        if got != head:
            raise self.error(f"{self.url_of(key)}: the download of its first {head} bytes ended at {got}; the "
                             "connection was cut, retry")

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        resp = self._get(key, Range=f"bytes={start}-{start + length - 1}")
        with self._errors("reading", key):
            return resp["Body"].read()

    # --- large objects ------------------------------------------------------------------------------------
    def _part_size(self, size: int) -> int:
        return max(self.config.part_size, math.ceil(size / _MAX_PARTS))

    def _multipart(self, key: str, size: int, read: Callable[[int, int], bytes]) -> None:
        """Upload ``size`` bytes, part ``i`` being ``read(offset, length)``, ``concurrency`` parts at a time;
        an upload that fails is aborted (no parts left billed in the bucket)."""
        part = self._part_size(size)
        upload_id = self._start_upload(key)
        try:
            def send(i: int) -> dict[str, Any]:
                off = i * part
                with self._slots:  # the part is read only once it may go
                    return self._upload_part(key, upload_id, i + 1, read(off, min(part, size - off)))

            parts = self._pool_map(send, list(range(max(1, math.ceil(size / part)))))
            self._complete_upload(key, upload_id, parts)
        except BaseException:
            self._abort(key, upload_id)
            raise

    # A multipart upload as boto3's own upload_file makes it: CRC32 checksums per part, checked by the server
    # on arrival, combined at the end (S3 then keeps a checksum of the whole object). Servers join the parts
    # faster this way too: moto's CompleteMultipartUpload of 512 MB took 3.1 s without, 1.4 s with.
    def _start_upload(self, key: str) -> str:
        with self._errors("starting an upload of", key):
            return self.client.create_multipart_upload(Bucket=self.bucket, Key=self.s3key(key),
                                                       ChecksumAlgorithm="CRC32")["UploadId"]

    def _upload_part(self, key: str, upload_id: str, number: int, body: bytes) -> dict[str, Any]:
        with self._errors(f"uploading part {number} of", key):
            resp = self.client.upload_part(Bucket=self.bucket, Key=self.s3key(key), UploadId=upload_id,
                                           PartNumber=number, Body=body, ChecksumAlgorithm="CRC32")
        part = {"PartNumber": number, "ETag": resp["ETag"]}
        if resp.get("ChecksumCRC32"):
            part["ChecksumCRC32"] = resp["ChecksumCRC32"]
        return part

    def _complete_upload(self, key: str, upload_id: str, parts: list[dict[str, Any]]) -> None:
        with self._errors("completing the upload of", key):
            self.client.complete_multipart_upload(Bucket=self.bucket, Key=self.s3key(key), UploadId=upload_id,
                                                  MultipartUpload={"Parts": parts})

    def _abort(self, key: str, upload_id: str) -> None:
        with contextlib.suppress(Exception):
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=self.s3key(key), UploadId=upload_id)

    def _ranged(self, key: str, size: int, etag: str, write: Callable[[int, bytes], None], start: int = 0) -> None:
        """Fetch bytes ``start`` to ``size`` as ranged GETs, ``concurrency`` at a time, handing each chunk to
        ``write(offset, chunk)`` as it streams in (memory stays at one chunk per transfer)."""
        part = self._part_size(size)
        extra = {"IfMatch": etag} if etag else {}

        def fetch(i: int) -> None:
            off = start + i * part
            end = min(size, off + part) - 1
            with self._slots:
                body = self._get(key, Range=f"bytes={off}-{end}", **extra)["Body"]
                with self._errors(f"downloading bytes {off}-{end} of", key):
                    while chunk := body.read(_CHUNK):
                        write(off, chunk)
                        off += len(chunk)
            if off != end + 1:
                raise self.error(f"{self.url_of(key)}: the download of bytes {start + i * part}-{end} ended at "
                                 f"{off}; the connection was cut, retry")

        self._pool_map(fetch, list(range(math.ceil((size - start) / part))))

    def open_write(self, key: str) -> Upload:
        return _StreamingUpload(self, key)

    def put_file(self, key: str, path: str | os.PathLike, *, durable: bool = False,
                 readonly: bool = False) -> None:
        size = os.path.getsize(path)
        if size < self.config.multipart_threshold:
            with open(path, "rb") as f, self._errors("uploading", key):
                self.client.put_object(Bucket=self.bucket, Key=self.s3key(key), Body=f.read())
            return
        fd = os.open(path, os.O_RDONLY)
        try:
            self._multipart(key, size, lambda off, n: os.pread(fd, n, off))
        finally:
            os.close(fd)

    def _download(self, key: str, dest: str, *, hashed: bool = False, algo: str = SHA256) -> str | None:
        found = self._first_part(key)
        if found is None:
            raise self.missing(key)
        resp, size = found
        fd = os.open(dest, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        hasher = PrefixHash(size, lambda off, n: os.pread(fd, n, off), algo) if hashed else None  # (the page cache's)
        try:
            os.ftruncate(fd, size)  # allocated once: the parts land at their offsets in any order

            def write(off: int, chunk: bytes) -> None:
                view, start = memoryview(chunk), off
                while view.nbytes:
                    n = os.pwrite(fd, view, off)
                    view, off = view[n:], off + n
                if hasher is not None:
                    hasher.landed(start, len(chunk))

            self._fill(key, resp, size, write)
            return hasher.hexdigest() if hasher is not None else None
        finally:
            if hasher is not None:
                hasher.stop()  # (a no-op once hexdigest() returned: the thread has ended)
            os.close(fd)

    # --- listing, deleting ----------------------------------------------------------------------------
    def list(self, prefix: str = "") -> list[ObjectInfo]:
        root = f"{self.prefix}/" if self.prefix else ""
        out: list[ObjectInfo] = []
        with self._errors("listing", prefix):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                              Prefix=root + prefix):
                for o in page.get("Contents", []):
                    out.append(ObjectInfo(o["Key"][len(root):], int(o["Size"]), str(o.get("ETag", "")).strip('"')))
        return sorted(out, key=lambda o: o.key)

    def delete(self, key: str) -> None:
        with self._errors("deleting", key):
            self.client.delete_object(Bucket=self.bucket, Key=self.s3key(key))

    def delete_many(self, keys: list[str]) -> None:
        """Delete ``keys`` in batches of 1000 (one request each)."""
        for i in range(0, len(keys), 1000):
            batch = [{"Key": self.s3key(k)} for k in keys[i:i + 1000]]
            with self._errors("deleting", keys[i]):
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})


class _StreamingUpload(Upload):
    """A multipart upload fed by ``write``: each full part is sent on a pool while the caller keeps writing, at
    most ``concurrency`` parts in flight, counted with the store's other transfers (memory stays at that many
    parts however many uploads stream at once). An object smaller than one part is
    one PUT; an aborted or failed upload is aborted in S3 too."""

    def __init__(self, store: S3Objects, key: str) -> None:
        super().__init__(key)
        self._store = store
        self._part = store.config.part_size
        self._buf = bytearray()
        self._upload_id: str | None = None
        self._futures: list[Future] = []
        self._slots = store._slots
        self._pool: ThreadPoolExecutor | None = None

    def _take(self, view: memoryview) -> None:
        part = self._part
        if self._buf:  # top up the part being gathered from small writes
            fill = part - len(self._buf)
            self._buf += view[:fill]
            view = view[fill:]
            if len(self._buf) < part:
                return
            self._send(bytes(self._buf))
            self._buf = bytearray()
        while view.nbytes >= part:  # a large write (a tensor) goes out in parts copied once, straight from it
            self._send(bytes(view[:part]))
            view = view[part:]
        self._buf += view

    def _send(self, data: bytes) -> None:
        store = self._store
        if self._upload_id is None:
            self._upload_id = store._start_upload(self.key)
            self._pool = ThreadPoolExecutor(store.config.concurrency, thread_name_prefix="stoker-upload")
        number = len(self._futures) + 1
        for done in self._futures:  # fail fast: a part that failed stops the writer at its next part
            if done.done() and done.exception() is not None:
                raise done.exception()  # type: ignore[misc]
        self._slots.acquire()

        upload_id = self._upload_id

        def send() -> dict[str, Any]:
            try:
                return store._upload_part(self.key, upload_id, number, data)
            finally:
                self._slots.release()

        assert self._pool is not None
        try:
            self._futures.append(self._pool.submit(send))
        except BaseException:
            self._slots.release()
            raise

    def _commit(self) -> None:
        store, s3key = self._store, self._store.s3key(self.key)
        try:
            if self._upload_id is None:
                with store._errors("writing", self.key):
                    store.client.put_object(Bucket=store.bucket, Key=s3key, Body=bytes(self._buf))
                return
            if self._buf:
                self._send(bytes(self._buf))
            store._complete_upload(self.key, self._upload_id, [f.result() for f in self._futures])
        except BaseException:
            self._abort_upload()
            raise
        finally:
            self._buf = bytearray()
            if self._pool is not None:
                self._pool.shutdown(wait=True)

    def _abort_upload(self) -> None:
        if self._pool is not None:
            for f in self._futures:
                if f.cancel():  # never ran: its slot is given back here (the store's other transfers share them)
                    self._slots.release()
            self._pool.shutdown(wait=True)
        if self._upload_id is not None:
            self._store._abort(self.key, self._upload_id)
            self._upload_id = None

    def abort(self) -> None:
        self._abort_upload()
        self._buf = bytearray()
        super().abort()
