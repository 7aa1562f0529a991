"""Inherited artifacts changed in place are stored again, as in Metaflow; unchanged ones are passed on as they are.

Metaflow stores every artifact a step read (its FlowSpec.__getattr__ caches a loaded artifact on the flow and
TaskDataStore.persist saves the flow's attributes), so `self.d["k"] = v` in a later step reaches the steps after it.
stoker stores only those that changed (compared with what was loaded), so an array a step only read is not re-stored.
"""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from stoker import FlowSpec, Parameter, step
from stoker.runtime.member import task as task_mod
from stoker.store.artifacts import load_artifact, save_artifact, unchanged_since_load
from stoker.store.blobs import LocalBlobStore


@pytest.fixture
def store(tmp_path) -> LocalBlobStore:
    return LocalBlobStore(tmp_path / "store")


class InPlaceFlow(FlowSpec):
    alpha = Parameter("alpha", default=1)

    @step
    def start(self):
        self.next(self.end)

    @step
    def end(self):
        pass


def _task(store, values: dict, run_inputs: dict | None = None) -> tuple[FlowSpec, dict]:
    """A task's flow object whose parent stored `values` (loaded lazily, as in a task)."""
    inherited = {name: save_artifact(store, v, name=name) for name, v in values.items()}
    inherited.update(run_inputs or {})
    task_mod._install_run_inputs(InPlaceFlow)
    flow = InPlaceFlow._task_instance(inherited, lambda desc, name: load_artifact(store, desc, name=name), "end",
                                      is_join=False)
    return flow, inherited


def _save(store, flow, monkeypatch) -> tuple[dict, list[str]]:
    """What the task stores for `flow` (its manifest's artifacts) and the names it serialized."""
    saved: list[str] = []

    def spy(store, value, *, name=None):
        saved.append(name)
        return save_artifact(store, value, name=name)

    monkeypatch.setattr(task_mod, "save_artifact", spy)
    ctx = SimpleNamespace(flow=flow, store=store, flow_cls=type(flow))
    manifest = SimpleNamespace(next=None, exception=None)
    artifacts = dict(flow.__dict__["_inherited"])
    assert task_mod._save_artifacts(ctx, manifest, artifacts, [{"artifacts": {}}]) == 0, manifest.exception
    return artifacts, saved


def test_a_dict_and_a_list_changed_in_place_are_stored(store, monkeypatch):
    flow, inherited = _task(store, {"d": {"start": 1}, "l": [1], "same": {"k": [1, 2]}, "unread": {"u": 1}})
    flow.d["a"] = 2
    flow.l.append(2)
    assert flow.same == {"k": [1, 2]}
    artifacts, saved = _save(store, flow, monkeypatch)
    assert sorted(saved) == ["d", "l"]
    assert load_artifact(store, artifacts["d"]) == {"start": 1, "a": 2}
    assert load_artifact(store, artifacts["l"]) == [1, 2]
    assert artifacts["same"] is inherited["same"] and artifacts["unread"] is inherited["unread"]


def test_an_unchanged_large_array_is_not_stored_again(store, monkeypatch):
    big = np.random.default_rng(0).random(3 << 20, dtype=np.float32)  # 12 MB: loaded as a memory map
    flow, inherited = _task(store, {"arr": big, "fortran": np.asfortranarray(np.ones((300, 200)))})
    assert float(flow.arr.sum(dtype=np.float64)) == float(big.sum(dtype=np.float64))
    assert flow.fortran.flags.f_contiguous
    pickled = []
    monkeypatch.setattr("stoker.store.artifacts._pickled", lambda obj: pickled.append(obj))  # never pickled
    artifacts, saved = _save(store, flow, monkeypatch)
    assert saved == [] and pickled == []
    assert artifacts["arr"] is inherited["arr"] and artifacts["fortran"] is inherited["fortran"]


def test_an_array_changed_in_place_is_stored(store, monkeypatch):
    flow, inherited = _task(store, {"arr": np.zeros(1 << 20, dtype=np.float32), "shaped": np.zeros((4, 6))})
    flow.arr[123] = 7.0  # a private (copy-on-write) page of the memory map
    flow.shaped.shape = (6, 4)  # the same bytes, another shape
    artifacts, saved = _save(store, flow, monkeypatch)
    assert sorted(saved) == ["arr", "shaped"]
    assert load_artifact(store, artifacts["arr"])[123] == 7.0 and load_artifact(store, inherited["arr"])[123] == 0
    assert load_artifact(store, artifacts["shaped"]).shape == (6, 4)


def test_read_and_reassigned_deleted_and_run_inputs(store, monkeypatch):
    flow, inherited = _task(store, {"n": 1, "gone": [1], "kept": [5]},
                            run_inputs={"alpha": save_artifact(store, {"cfg": 1})})
    flow.n += 1  # read, then assigned: the new value
    flow.gone.append(2)
    del flow.gone  # this step's value is dropped: the parent's is passed on, and read again
    assert flow.gone == [1]
    flow.kept.append(6)
    del flow.kept
    flow.alpha["cfg"] = 2  # a run input is not an artifact of the step
    artifacts, saved = _save(store, flow, monkeypatch)
    assert sorted(saved) == ["n"]
    assert load_artifact(store, artifacts["n"]) == 2
    assert artifacts["gone"] is inherited["gone"] and artifacts["kept"] is inherited["kept"]
    assert artifacts["alpha"] is inherited["alpha"]


@pytest.mark.parametrize("value", [
    {"a": 1, "b": [1, 2]},
    {"s" + str(i) for i in range(50)},  # a set: pickled in another order in another process, same value
    b"x" * 5000,
    bytearray(b"y" * 5000),
    list(range(100000)),  # a pickle body large enough to be compressed
    {"w": np.arange(1 << 18, dtype=np.int64), "b": np.ones(3)},  # arrays out of band
    np.arange(10).reshape(2, 5)[:, ::2],  # a strided view
])
def test_unchanged_since_load(store, value):
    desc = save_artifact(store, value)
    loaded = load_artifact(store, desc)
    assert unchanged_since_load(store, loaded, desc)


def test_changes_are_seen(store):
    cases = [
        ({"a": 1}, lambda v: v.__setitem__("b", 2)),
        ({"s" + str(i) for i in range(50)}, lambda v: v.add("new")),
        (bytearray(b"y" * 5000), lambda v: v.__setitem__(0, 0)),
        (list(range(100000)), lambda v: v.__setitem__(5000, -1)),
        ({"w": np.arange(1 << 18, dtype=np.int64)}, lambda v: v["w"].__setitem__(7, -1)),
        (np.arange(12, dtype=np.int32), lambda v: setattr(v, "shape", (3, 4))),
    ]
    for value, change in cases:
        desc = save_artifact(store, value)
        loaded = load_artifact(store, desc)
        change(loaded)
        assert not unchanged_since_load(store, loaded, desc), value


def test_a_set_pickled_in_another_process_is_unchanged(store, tmp_path):
    """A set of strings pickles in an order that depends on the process's hash seed."""
    code = ("import json, sys\nfrom stoker.store.artifacts import save_artifact\nfrom stoker.store.blobs import "
            "LocalBlobStore\nprint(json.dumps(save_artifact(LocalBlobStore(sys.argv[1]), "
            "{'s' + str(i) for i in range(200)})))")
    desc = json.loads(subprocess.run([sys.executable, "-c", code, str(tmp_path / "store")], check=True,
                                     capture_output=True, text=True, env={"PYTHONHASHSEED": "123"}).stdout)
    assert unchanged_since_load(store, load_artifact(store, desc), desc)


def test_a_tensor_read_is_compared_by_its_bytes(store):
    torch = pytest.importorskip("torch")
    for value in [torch.arange(1 << 18, dtype=torch.bfloat16), torch.nn.Parameter(torch.ones(4, 5))]:
        desc = save_artifact(store, value)
        loaded = load_artifact(store, desc)
        assert unchanged_since_load(store, loaded, desc)
        with torch.no_grad():
            loaded[1] = 3
        assert not unchanged_since_load(store, loaded, desc)
