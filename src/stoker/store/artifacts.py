"""Artifact serialization: any Python object to blobs and a small JSON descriptor, and back.

Kinds (the descriptor's ``kind``):

- ``ndarray``: a numpy array of a plain dtype. Its raw buffer is streamed into the store in chunks
  (hashed while written, never copied through pickle) and read back with ``np.fromfile`` or a memory map.
- ``tensor``: a strided torch tensor (any dtype incl. bfloat16/float8, any device, non-contiguous). Its
  CPU bytes are viewed as uint8 and stored like an array; loaded back on the CPU. torch is imported only
  when the object *is* a tensor (``sys.modules`` check), so the flow engine never imports it.
- ``bytes``: a large bytes/bytearray, stored as is.
- ``pickle``: everything else, pickled with protocol 5. Buffers of arrays and tensors inside containers
  (state dicts, lists of arrays) travel out of band, concatenated (64-byte aligned) into one data blob.
  The pickle body is compressed (zstd, else zlib) only when it is large and a sample compresses well;
  a tiny body is kept inline in the descriptor so small values cost no file. Loading one runs code, so it
  is loaded only from a verified manifest (stoker.store.signing), its body's hash checked, and only when
  its writer is trusted (``STOKER_TRUST``).
- ``secret``: the value of a ``Parameter(secret=True)``. It is never stored: the descriptor names the
  environment variable that holds it (JSON) in the processes of the run.

A descriptor: ``{"kind", "type", "size", "repr", "sha", "blobs": [...], ...kind-specific fields}``.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import os
import pickle
import reprlib
import sys
from collections.abc import Iterator
from typing import Any

from stoker._hashing import CHUNK, SHA256, content_key, key_algo, key_of, new_hash, preferred_algo
from stoker.errors import StoreError
from stoker.redact import REDACTED, SECRET_ENV_PREFIX
from stoker.store.blobs import BlobStore, CorruptBlobError
from stoker.store.signing import check_owner

log = logging.getLogger(__name__)

INLINE_MAX = 1024  # pickle bodies up to this size live in the descriptor
COMPRESS_MIN = 16 << 10  # bodies smaller than this are never compressed
COMPRESS_SAMPLE = 256 << 10  # bytes compressed to decide whether compression pays
COMPRESS_RATIO = 0.8  # compress when the sample shrinks below this fraction
ALIGN = 64  # out-of-band buffers start at multiples of this in the data blob
MMAP_MIN = 1 << 20  # by default, blobs at least this large are memory-mapped rather than read

_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 6


def type_name(obj: Any) -> str:
    """``module.QualName`` of the object's type (plain name for builtins)."""
    t = type(obj)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def short_repr(obj: Any, limit: int = 80) -> str:
    """A repr short enough for a table cell; never raises."""
    try:
        if _is_ndarray(obj):
            text = f"array(shape={obj.shape}, dtype={obj.dtype})"
        elif _torch_of(obj) is not None:
            text = f"tensor(shape={list(obj.shape)}, dtype={obj.dtype}, device={obj.device})"
        elif isinstance(obj, bytes | bytearray):  # reprlib has no bytes case: it would repr all of a 64 MB value
            text = repr(obj[:limit]) + ("..." if len(obj) > limit else "")
        else:
            text = _repr.repr(obj)
    except Exception as e:  # a user __repr__ may fail
        text = f"<{type_name(obj)}: repr failed: {type(e).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _LazyNumpy:
    """numpy, imported on first use: a flow whose artifacts hold no arrays never pays for importing it."""

    def __getattr__(self, name: str) -> Any:
        import numpy

        globals()["np"] = numpy
        return getattr(numpy, name)


np: Any = _LazyNumpy()


def _is_ndarray(obj: Any) -> bool:
    numpy = sys.modules.get("numpy")  # an ndarray exists only once numpy is imported
    return numpy is not None and isinstance(obj, numpy.ndarray)


def _torch_of(obj: Any) -> Any:
    """The torch module if ``obj`` is a torch tensor (without importing torch), else None."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return torch
    return None


# --- raw buffers -------------------------------------------------------------------------------------
def _raw_array_ok(obj: Any) -> bool:
    if not _is_ndarray(obj):
        return False
    dt = obj.dtype
    return (type(obj) in (np.ndarray, np.memmap) and not dt.hasobject and dt.fields is None
            and dt.subdtype is None and dt.itemsize > 0)


def _chunks_of(flat: np.ndarray) -> Iterator[memoryview]:
    """Chunks of a 1-D contiguous uint8 array, as memoryviews (no copy)."""
    view = memoryview(flat)
    for off in range(0, len(flat), CHUNK):
        yield view[off: off + CHUNK]


def _array_chunks(arr: np.ndarray) -> Iterator[memoryview]:
    """The array's bytes in C order (or its transpose's for Fortran-ordered arrays), chunk by chunk."""
    if arr.flags.c_contiguous:
        yield from _chunks_of(arr.reshape(-1).view(np.uint8))
    elif arr.flags.f_contiguous:
        yield from _chunks_of(arr.T.reshape(-1).view(np.uint8))
    else:  # copy slab by slab so a strided view never needs a full contiguous copy
        row = max(1, arr[0].nbytes if arr.shape[0] else 1)
        step = max(1, CHUNK // row)
        for i in range(0, arr.shape[0], step):
            yield from _chunks_of(np.ascontiguousarray(arr[i: i + step]).reshape(-1).view(np.uint8))


def _read_raw(store: BlobStore, key: str, nbytes: int, mmap: bool | None) -> np.ndarray:
    """A uint8 array with blob ``key``'s bytes, verified against the key before it is returned: read into memory
    (and those bytes hashed), or a copy-on-write memory map (its pages hashed where they lie, once per process for
    the same file; they are shared with the page cache until written, and writes stay private to this process)."""
    if nbytes == 0:
        return np.empty(0, dtype=np.uint8)

    def torn(path: Any, size: int) -> StoreError:
        return StoreError(f"blob {key} in {store.url} has {size} bytes, expected {nbytes}: it is torn or corrupted "
                          f"({path}); re-run the step that produced it")

    if mmap or (mmap is None and nbytes >= MMAP_MIN):
        def mapped(path: Any) -> np.memmap:
            if (size := path.stat().st_size) != nbytes:
                raise torn(path, size)
            return np.memmap(path, dtype=np.uint8, mode="c", shape=(nbytes,))

        return np.asarray(store.read_blob(key, mapped))

    def read(path: Any) -> np.ndarray:
        raw = np.fromfile(path, dtype=np.uint8)
        if raw.nbytes != nbytes:
            raise torn(path, raw.nbytes)
        return raw

    return store.read_blob(key, read, once=False)


def _tensor_raw_ok(obj: Any, torch: Any) -> bool:
    return (type(obj) in (torch.Tensor, torch.nn.Parameter) and obj.layout == torch.strided
            and not obj.is_quantized and obj.device.type != "meta")


def _tensor_bytes(obj: Any) -> np.ndarray:
    """A 1-D uint8 numpy view of a CPU, contiguous copy (only if needed) of the tensor."""
    t = obj.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.reshape(-1).view(_torch_of(t).uint8).numpy()


def _tensor_meta(obj: Any) -> dict[str, Any]:
    return {"dtype": str(obj.dtype).removeprefix("torch."), "shape": list(obj.shape),
            "requires_grad": bool(obj.requires_grad), "device": str(obj.device),
            "parameter": type(obj).__name__ == "Parameter"}


def _rebuild_tensor(buf: Any, dtype: str, shape: list[int], requires_grad: bool, parameter: bool) -> Any:
    """Rebuild a tensor from its raw bytes (used by load_artifact and by unpickling)."""
    import torch

    raw = buf if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)
    t = torch.from_numpy(raw) if raw.size else torch.empty(0, dtype=torch.uint8)
    t = t.view(getattr(torch, dtype)).reshape(shape)
    if parameter:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    if requires_grad:
        t.requires_grad_(True)
    return t


class _Pickler(pickle.Pickler):
    """Protocol-5 pickler that sends torch tensors' raw bytes out of band (numpy arrays do so natively)."""

    def reducer_override(self, obj: Any) -> Any:
        torch = _torch_of(obj)
        if torch is not None and _tensor_raw_ok(obj, torch):
            m = _tensor_meta(obj)
            return _rebuild_tensor, (pickle.PickleBuffer(_tensor_bytes(obj)), m["dtype"], m["shape"],
                                     m["requires_grad"], m["parameter"])
        return NotImplemented


# --- compression -------------------------------------------------------------------------------------
def _compressor() -> tuple[str, Any]:
    try:
        import zstandard

        return "zstd", zstandard.ZstdCompressor(level=3).compress
    except ImportError:
        import zlib

        return "zlib", lambda b: zlib.compress(b, 6)


def _decompress(data: bytes, method: str | None) -> bytes:
    if method is None:
        return data
    if method == "zstd":
        try:
            import zstandard
        except ImportError as e:
            raise StoreError("this artifact is zstd-compressed: pip install zstandard") from e
        return zstandard.ZstdDecompressor().decompress(data, max_output_size=1 << 40)
    if method == "zlib":
        import zlib

        return zlib.decompress(data)
    raise StoreError(f"unknown artifact compression {method!r} (written by a newer stoker?)")


def _maybe_compress(body: bytes) -> tuple[bytes, str | None]:
    """Compress ``body`` only when it is large and a sample of it compresses well."""
    if len(body) < COMPRESS_MIN:
        return body, None
    method, compress = _compressor()
    sample = body[:COMPRESS_SAMPLE]
    if len(compress(sample)) > COMPRESS_RATIO * len(sample):
        return body, None
    packed = compress(body)
    return (packed, method) if len(packed) < COMPRESS_RATIO * len(body) else (body, None)


# --- public API --------------------------------------------------------------------------------------
def save_artifact(store: BlobStore, obj: Any, *, name: str | None = None) -> dict[str, Any]:
    """Serialize ``obj`` into ``store``; return its JSON-serializable descriptor.

    ``name`` (the artifact's name) only makes error messages clearer. Blobs are addressed by their BLAKE3 hash
    (keys ``b3-...``) where the ``blake3`` package is installed, else by their sha256.
    """
    base = {"type": type_name(obj), "repr": short_repr(obj)}
    algo = preferred_algo()
    if _raw_array_ok(obj):
        order = "F" if (obj.flags.f_contiguous and not obj.flags.c_contiguous) else "C"
        key = store.put_blob_stream(_array_chunks(obj), algo=algo)
        return {"kind": "ndarray", **base, "type": "numpy.ndarray", "size": int(obj.nbytes), "sha": key,
                "blobs": [key], "dtype": obj.dtype.str, "shape": list(obj.shape), "order": order}
    if type(obj) in (bytes, bytearray) and len(obj) > INLINE_MAX:
        key = store.put_blob(obj, algo=algo)
        return {"kind": "bytes", **base, "size": len(obj), "sha": key, "blobs": [key]}
    torch = _torch_of(obj)
    if torch is not None and _tensor_raw_ok(obj, torch):
        raw = _tensor_bytes(obj)
        key = store.put_blob_stream(_chunks_of(raw), algo=algo)
        return {"kind": "tensor", **base, "size": int(raw.nbytes), "sha": key, "blobs": [key],
                **_tensor_meta(obj)}
    return _save_pickle(store, obj, base, name, algo)


def _pickled(obj: Any) -> tuple[bytes, list[memoryview]]:
    """The protocol-5 pickle body of ``obj`` and its out-of-band buffers (arrays', tensors' bytes, not copied)."""
    buffers: list[pickle.PickleBuffer] = []
    bio = io.BytesIO()
    _Pickler(bio, protocol=5, buffer_callback=buffers.append).dump(obj)
    return bio.getvalue(), [b.raw() for b in buffers]


def _save_pickle(store: BlobStore, obj: Any, base: dict[str, Any], name: str | None, algo: str) -> dict[str, Any]:
    try:
        body, views = _pickled(obj)
    except Exception as e:
        what = f"artifact {name!r}" if name else "object"
        raise StoreError(f"cannot store {what} of type {type_name(obj)}: it cannot be pickled ({e}). "
                         f"Delete it before the step ends (del self.{name or 'x'}) or make it picklable") from e
    size = len(body) + sum(v.nbytes for v in views)
    desc: dict[str, Any] = {"kind": "pickle", **base, "size": size}
    if not views and len(body) <= INLINE_MAX:
        desc.update(sha=hashlib.sha256(body).hexdigest(), blobs=[], inline=base64.b64encode(body).decode())
        return desc
    packed, method = _maybe_compress(body)
    body_key = store.put_blob(packed, algo=algo)
    desc.update(sha=body_key, blobs=[body_key], compression=method)
    if views:
        spans, off = [], 0
        for v in views:
            spans.append([off, v.nbytes])
            off = -(-(off + v.nbytes) // ALIGN) * ALIGN
        desc["buffers"] = spans
        desc["data_size"] = spans[-1][0] + spans[-1][1]
        desc["blobs"].append(store.put_blob_stream(_buffer_chunks(views), algo=algo))
    return desc


def _buffer_chunks(views: list[memoryview]) -> Iterator[memoryview | bytes]:
    off = 0
    for i, v in enumerate(views):
        flat = np.frombuffer(v, dtype=np.uint8) if v.nbytes else np.empty(0, np.uint8)
        yield from _chunks_of(flat)
        off += v.nbytes
        if i + 1 < len(views) and off % ALIGN:
            pad = ALIGN - off % ALIGN
            yield bytes(pad)
            off += pad


def unchanged_since_load(store: BlobStore, obj: Any, desc: dict[str, Any]) -> bool:
    """Whether ``obj``, loaded from ``desc`` in this process and maybe changed in place since (``d["k"] = v``,
    ``arr[0] = 1``), still holds what ``desc`` stores: then a step that read it passes ``desc`` on, else it stores
    ``obj`` again (as Metaflow stores every artifact a step read).

    Arrays and tensors: their metadata and a BLAKE3 (multi-threaded) hash of their raw bytes, where they lie, against
    the blob's key: no pickling, no copy of a contiguous one. Pickled values: pickled again and compared with the
    stored body and buffers; where the bytes differ although the value may not have (a set's order differs between
    processes), or where the body is compressed, with the stored value pickled here too. False when unsure (a
    value that cannot be pickled now: storing it then says why)."""
    kind = desc.get("kind")
    try:
        if kind == "secret":
            return True
        if kind == "ndarray":
            order = "F" if (_raw_array_ok(obj) and obj.flags.f_contiguous and not obj.flags.c_contiguous) else "C"
            return (_raw_array_ok(obj) and obj.dtype.str == desc["dtype"] and list(obj.shape) == desc["shape"]
                    and order == desc.get("order", "C") and _stream_key(_array_chunks(obj), desc["blobs"][0]))
        if kind == "tensor":
            torch = _torch_of(obj)
            if torch is None or not _tensor_raw_ok(obj, torch):
                return False
            meta = _tensor_meta(obj)
            return (all(meta[k] == desc.get(k, meta[k] if k == "parameter" else None)
                        for k in ("dtype", "shape", "requires_grad", "parameter"))
                    and _stream_key(_chunks_of(_tensor_bytes(obj)), desc["blobs"][0]))
        if kind == "bytes":
            return type_name(obj) == desc["type"] and (type(obj) is bytes or content_key(
                obj, key_algo(desc["blobs"][0]) or SHA256) == desc["blobs"][0])
        if kind == "pickle":
            body, views = _pickled(obj)
            if _same_stored_pickle(store, body, views, desc):
                return True
            fresh_body, fresh_views = _pickled(_load_pickle(store, desc, None))
            algo = preferred_algo()
            return fresh_body == body and len(fresh_views) == len(views) and all(
                content_key(a, algo) == content_key(b, algo) for a, b in zip(fresh_views, views, strict=True))
    except Exception:  # noqa: BLE001 - a value that cannot be compared is stored again (which then says why)
        return False
    return False


def _stream_key(chunks: Iterator[Any], key: str) -> bool:
    """Whether the concatenated ``chunks`` hash to the content key ``key`` (under the hash it names)."""
    h = new_hash(key_algo(key) or SHA256)
    for c in chunks:
        h.update(c)
    return key_of(key_algo(key) or SHA256, h.hexdigest()) == key


def _same_stored_pickle(store: BlobStore, body: bytes, views: list[memoryview], desc: dict[str, Any]) -> bool:
    """Whether a pickle body and its buffers are byte for byte the ones ``desc`` stores (hashes, not reads, where
    the descriptor names them)."""
    spans = desc.get("buffers") or []
    if [n for _, n in spans] != [v.nbytes for v in views]:
        return False
    if "inline" in desc:
        same_body = base64.b64decode(desc["inline"]) == body
    elif desc.get("compression"):
        same_body = _decompress(store.get_blob(desc["blobs"][0]), desc["compression"]) == body
    else:
        blob = desc["blobs"][0]
        same_body = content_key(body, key_algo(blob) or SHA256) == blob
    return same_body and (not views or _stream_key(_buffer_chunks(views), desc["blobs"][1]))


def load_artifact(store: BlobStore, desc: dict[str, Any], *, mmap: bool | None = None, name: str | None = None,
                  pathspec: str | None = None) -> Any:
    """Rebuild the object described by ``desc`` (from :func:`save_artifact`).

    Every blob is verified against its content address before anything built from it is returned: bytes and
    pickle bodies as they are read, arrays, tensors and out-of-band buffers too (a memory-mapped one: its pages,
    once per process). A blob that was changed after it was written raises StoreError naming the artifact
    (``name``), its task (``pathspec``, ``Flow/run/step/task``, when the caller knows them) and the fix.

    Arrays, tensors and out-of-band buffers are backed by a copy-on-write memory map of their blob when
    ``mmap=True`` (or, by default, when at least 1 MiB): loading is then nearly free, pages come from
    the page cache as they are touched, and writes stay private to the process. ``mmap=False`` reads
    them into memory.
    """
    try:
        return _load(store, desc, mmap)
    except CorruptBlobError as e:
        raise _changed_blob(store, desc, e, name, pathspec) from None


def _load(store: BlobStore, desc: dict[str, Any], mmap: bool | None) -> Any:
    kind = desc.get("kind")
    try:
        if kind == "ndarray":
            dtype = np.dtype(desc["dtype"])
            shape = tuple(desc["shape"])
            raw = _read_raw(store, desc["blobs"][0], int(desc["size"]), mmap)
            arr = raw.view(dtype) if raw.size else np.empty(0, dtype)
            if desc.get("order") == "F":
                return arr.reshape(shape[::-1]).T
            return arr.reshape(shape)
        if kind == "tensor":
            raw = _read_raw(store, desc["blobs"][0], int(desc["size"]), mmap)
            return _rebuild_tensor(raw, desc["dtype"], desc["shape"], desc["requires_grad"],
                                   desc.get("parameter", False))
        if kind == "pickle":
            check_owner(desc)
            return _load_pickle(store, desc, mmap)
        if kind == "secret":
            return load_secret(desc)
        if kind == "bytes":
            data = store.get_blob(desc["blobs"][0])
            return bytearray(data) if desc["type"] == "bytearray" else data
    except (KeyError, IndexError, TypeError) as e:
        raise StoreError(f"malformed artifact descriptor ({e!r}): {desc}") from e
    raise StoreError(f"unknown artifact kind {kind!r} in descriptor {desc} (written by a newer stoker?)")


def _changed_blob(store: BlobStore, desc: dict[str, Any], e: CorruptBlobError, name: str | None,
                  pathspec: str | None) -> StoreError:
    """The one-line error of an artifact whose blob no longer matches its content address, with the fix."""
    what = f"artifact {name!r}" if name else f"an artifact of type {desc.get('type')} ({desc.get('repr')})"
    parts = pathspec.split("/") if pathspec else []
    run, step = (parts[1], parts[2]) if len(parts) >= 3 else ("RUN", "STEP")
    also = (" (a put skips a blob already stored: delete that object first)" if e.remote else "")
    return StoreError(
        f"{what}{f' of task {pathspec}' if pathspec else ''} was not loaded: its blob {e.key} in the store "
        f"{store.url} does not match its hash (its content hashes to {e.got[:19]}...): the blob was changed after "
        f"it was written. Rerun the step that made it (python flow.py resume {run} --step {step}){also}, or restore "
        f"the blob from a copy")


def _load_pickle(store: BlobStore, desc: dict[str, Any], mmap: bool | None) -> Any:
    if "inline" in desc:
        body = base64.b64decode(desc["inline"])  # (inside the signed manifest)
    else:
        packed = store.get_blob(desc["blobs"][0])  # hashed against its key: the signed manifest names this content
        body = _decompress(packed, desc.get("compression"))
    buffers: list[memoryview] = []
    if desc.get("buffers"):
        data = memoryview(_read_raw(store, desc["blobs"][1], int(desc["data_size"]), mmap))
        buffers = [data[o: o + n] for o, n in desc["buffers"]]
    try:
        return pickle.loads(body, buffers=buffers)
    except Exception as e:
        raise StoreError(f"cannot unpickle artifact of type {desc.get('type')}: {e}. Is the code that "
                         f"defines it importable here (same package versions)?") from e


def secret_descriptor(attr: str, value: Any) -> tuple[dict[str, Any], str, str]:
    """The descriptor stored for a secret run input (no value in it), the environment variable that carries
    the value to the run's tasks, and the value encoded for it (JSON)."""
    env = SECRET_ENV_PREFIX + attr.upper()
    return ({"kind": "secret", "type": type_name(value), "repr": REDACTED, "size": 0, "sha": None, "blobs": [],
             "env": env}, env, json.dumps(value))


def load_secret(desc: dict[str, Any]) -> Any:
    """A secret run input's value, from the environment variable its descriptor names."""
    env = desc.get("env") or ""
    if not env.startswith(SECRET_ENV_PREFIX) or env not in os.environ:
        raise StoreError(f"this secret parameter's value is not stored anywhere: the run's processes get it in "
                         f"the environment variable {env or SECRET_ENV_PREFIX + 'NAME'} (JSON). Set it (e.g. to "
                         f"resume the run, or on a remote node, see docs/store.md 'Security')")
    try:
        return json.loads(os.environ[env])
    except json.JSONDecodeError:
        return os.environ[env]


def artifact_blobs(desc: dict[str, Any]) -> list[str]:
    """The blob keys an artifact descriptor refers to (for copying or garbage collection)."""
    return list(desc.get("blobs", []))
