"""Artifact serialization of torch tensors and state dicts (raw bytes, no torch.save/pickle copy)."""

from __future__ import annotations

import pytest

from stoker.store import load_artifact, save_artifact

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def roundtrip(store, obj, **kw):
    desc = save_artifact(store, obj)
    return desc, load_artifact(store, desc, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool,
                                   torch.uint8, torch.complex64, torch.float8_e4m3fn])
@pytest.mark.parametrize("mmap", [None, False])
def test_tensor_dtypes(store, dtype, mmap):
    src = (torch.randn(4, 5) * 3)
    t = src.to(dtype) if dtype != torch.complex64 else torch.complex(src, -src)
    desc, out = roundtrip(store, t, mmap=mmap)
    assert desc["kind"] == "tensor" and desc["dtype"] == str(dtype).removeprefix("torch.")
    assert out.dtype == dtype and out.shape == t.shape and out.device.type == "cpu"
    assert torch.equal(out.view(torch.uint8), t.view(torch.uint8))  # bit-exact, even for float8


def test_non_contiguous_and_scalar_and_empty(store):
    base = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    for t in (base.t(), base[::2, 3:7], base[:, 1], torch.tensor(2.5), torch.empty(0, 3, dtype=torch.bfloat16),
              torch.arange(6.0).expand(4, 6)):
        desc, out = roundtrip(store, t)
        assert desc["kind"] == "tensor" and out.is_contiguous()
        assert out.shape == t.shape and torch.equal(out, t)


def test_large_bf16_tensor_via_mmap_is_writable_copy_on_write(store):
    t = torch.randn(1024, 1024).to(torch.bfloat16)  # 2 MiB -> memory mapped
    desc, out = roundtrip(store, t)
    assert desc["size"] == 2 << 20 and torch.equal(out, t)
    out.add_(1)  # writes stay private to this process
    assert torch.equal(load_artifact(store, desc), t)


def test_requires_grad_and_parameter(store):
    p = torch.nn.Parameter(torch.randn(3, 3))
    desc, out = roundtrip(store, p)
    assert desc["parameter"] and isinstance(out, torch.nn.Parameter) and out.requires_grad
    assert torch.equal(out.detach(), p.detach())
    g = torch.randn(2, requires_grad=True) * 2  # non-leaf with grad
    _, out = roundtrip(store, g)
    assert out.requires_grad and out.is_leaf and torch.equal(out.detach(), g.detach())


def test_state_dict_goes_out_of_band(store):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 8))
    model = model.to(torch.bfloat16)
    sd = model.state_dict()
    desc, out = roundtrip(store, {"model": sd, "step": 7, "opt": {"lr": 1e-3}})
    assert desc["kind"] == "pickle" and len(desc["buffers"]) == len(sd)
    body = len(store.get_bytes(desc["blobs"][0]))
    assert body < 4096, "tensor bytes must not be in the pickle body"
    assert out["step"] == 7 and list(out["model"]) == list(sd)
    for k, v in sd.items():
        assert out["model"][k].dtype == torch.bfloat16 and torch.equal(out["model"][k], v)
    fresh = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 8))
    fresh.to(torch.bfloat16).load_state_dict(out["model"])


def test_list_of_tensors_and_module(store):
    ts = [torch.randn(3), torch.arange(4).reshape(2, 2).t(), torch.tensor([True])]
    desc, out = roundtrip(store, ts)
    assert all(torch.equal(a, b) for a, b in zip(out, ts, strict=True)) and len(desc["buffers"]) == 3
    lin = torch.nn.Linear(4, 2)
    _, out = roundtrip(store, lin)  # a whole module pickles too; its parameters travel out of band
    assert isinstance(out, torch.nn.Linear) and torch.equal(out.weight, lin.weight)
    assert isinstance(out.weight, torch.nn.Parameter)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensor_loads_on_cpu(store):
    t = torch.randn(8, 8, device="cuda").to(torch.bfloat16)
    desc, out = roundtrip(store, t)
    assert desc["device"].startswith("cuda") and out.device.type == "cpu"
    assert torch.equal(out, t.cpu())
