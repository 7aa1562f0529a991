"""The pieces a remote member relies on: who it is (from the engine's environment), the code package, the
member spec, and per-step routing."""

from __future__ import annotations

import io
import tarfile

import pytest

from stoker import FlowSpec, resources, step
from stoker.backends.aws.node import BATCH
from stoker.backends.slurm.node import SLURM, port_for_job
from stoker.backends.slurm.states import expand_hostlist
from stoker.errors import ConfigError
from stoker.runtime.member.node import member_spec
from stoker.runtime.member.nodeenv import node_identity
from stoker.runtime.package import build_package, stage_package, unpack_package
from stoker.runtime.spec import GangSlot, TaskSpec
from stoker.store.blobs import open_store


def test_hostlists_expand_like_slurm():
    assert expand_hostlist("n[1-3,5],gpu07") == ["n1", "n2", "n3", "n5", "gpu07"]
    assert expand_hostlist("node[008-010]") == ["node008", "node009", "node010"]
    assert expand_hostlist("solo") == ["solo"]


def test_identity_from_each_engine():
    slurm = {"SLURM_JOB_ID": "42", "SLURM_NODEID": "1", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "n[3-4]"}
    ident = node_identity(slurm, SLURM)
    assert (ident.member, ident.num_nodes, ident.main_addr, ident.port) == (1, 2, "n3", port_for_job("42"))
    assert node_identity({**slurm, "STOKER_MAIN_ADDR": "10.0.0.3"}, SLURM).main_addr == "10.0.0.3"
    assert node_identity({**slurm, "SLURM_ARRAY_TASK_ID": "7", "SLURM_NODEID": "0"}, SLURM).member == 7
    batch = {"AWS_BATCH_JOB_NODE_INDEX": "3", "AWS_BATCH_JOB_NUM_NODES": "4",
             "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.1.2.3"}
    got = node_identity(batch, BATCH)
    assert (got.member, got.num_nodes, got.main_addr, got.port) == (3, 4, "10.1.2.3", 29500) and got.addr
    local = {"STOKER_MEMBER": "2", "STOKER_NUM_NODES": "3", "STOKER_MAIN_PORT": "1234", **slurm}
    assert node_identity(local, SLURM) == node_identity(local).__class__(2, 3, "127.0.0.1", 1234), "local wins"
    assert node_identity(slurm) == node_identity(batch) == node_identity({}), "the generic node reads no engine's"
    assert port_for_job("42") != port_for_job("43"), "a retried gang rendezvous on a fresh port"


def test_member_spec_fills_the_gang_position_at_run_time():
    typed = [TaskSpec(flow="F", run_id="1", step="train", task_id=str(i), parallel=slot)
             for i, slot in enumerate(GangSlot.gang(2, "0"))]
    specs = [s.to_dict() for s in typed]  # a remote unit's document holds JSON; a local one's, the specs
    env = {"SLURM_JOB_ID": "9", "SLURM_NODEID": "1", "SLURM_JOB_NUM_NODES": "2", "STOKER_MAIN_ADDR": "10.0.0.1"}
    for doc in ({"kind": "gang", "specs": specs}, {"kind": "gang", "specs": typed}):
        spec = member_spec(doc, env, SLURM)
        assert spec.task_id == "1" and spec.parallel == GangSlot(main_ip="10.0.0.1", num_nodes=2, node_index=1,
                                                                 port=port_for_job("9"), control_task_id="0")
    assert typed[1].parallel.main_ip is None, "the driver's spec is left as it was"
    with pytest.raises(SystemExit, match="more members"):
        member_spec({"kind": "gang", "specs": specs}, {**env, "SLURM_NODEID": "5"}, SLURM)


def test_code_package_is_deterministic_and_skips_what_is_not_code(tmp_path):
    (tmp_path / "flow.py").write_text("print('hi')\n")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "run.toml").write_text("a = 1\n")
    (tmp_path / ".stoker").mkdir()
    (tmp_path / ".stoker" / "x.py").write_text("no")
    (tmp_path / "weights.bin").write_bytes(b"\0" * 10)
    (tmp_path / "big.json").write_text("x" * (2 << 20))
    (tmp_path / "credentials.json").write_text("{}")
    (tmp_path / "conf" / "api_token.txt").write_text("s3cr3t")
    a, flow_path = build_package(tmp_path / "flow.py")
    b, _ = build_package(tmp_path / "flow.py")
    assert a == b and flow_path == "flow.py"
    names = tarfile.open(fileobj=io.BytesIO(a)).getnames()
    assert "flow.py" in names and "conf/run.toml" in names
    assert not any(n.startswith(".stoker") or n in ("weights.bin", "big.json") for n in names)
    assert "credentials.json" not in names and "conf/api_token.txt" not in names, "secrets never travel"


def test_package_round_trip_through_the_store(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "flow.py").write_text("X = 1\n")
    store = open_store(tmp_path / "store")
    key, flow_path = stage_package(store, tmp_path / "src" / "flow.py")
    first = unpack_package(store, key, tmp_path / "cache")
    assert (first / flow_path).read_text() == "X = 1\n"
    assert unpack_package(store, key, tmp_path / "cache") == first, "unpacked once per key"


@pytest.mark.parametrize("python_has_filters", [True, False])
def test_unpacking_refuses_what_no_package_holds(tmp_path, monkeypatch, python_has_filters):
    """Packages unpack on Pythons with tarfile's "data" filter and on those without it (3.11.2 of Debian 12, a
    real CI interpreter here: its absence broke every Batch node); either way a link or a name with `..` is
    refused and nothing is written outside the cache. (Without the filter: simulated by removing it.)"""
    if not python_has_filters:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    elif not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python has no tarfile data filter")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "flow.py").write_text("X = 1\n")
    store = open_store(tmp_path / "store")
    key, flow_path = stage_package(store, tmp_path / "src" / "flow.py")
    assert (unpack_package(store, key, tmp_path / "cache") / flow_path).read_text() == "X = 1\n"
    for evil in ("../escaped.txt", "link"):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            info = tarfile.TarInfo(evil)
            if evil == "link":
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(info)
            else:
                info.size = 4
                tar.addfile(info, io.BytesIO(b"evil"))
        bad = store.put_bytes(buf.getvalue())
        with pytest.raises(Exception, match="escaped|link|outside|not unpacked"):
            unpack_package(store, bad, tmp_path / "cache")
        assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "cache" / bad).exists()


class Routed(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @resources(cpu=1)
    @step
    def train(self):
        self.next(self.end)

    @step
    def end(self):
        pass


def test_backend_per_step():
    from stoker.backends import StepRouter
    from stoker.backends.local import LocalBackend

    made = []

    def factory(name):
        made.append(name)
        return LocalBackend()

    router = StepRouter(Routed, default="slurm=train", factory=factory)
    assert [router.name_for(s) for s in ("start", "train", "end")] == ["local", "slurm", "local"]
    assert StepRouter(Routed, default="slurm").name_for("start") == "slurm"
    assert StepRouter(Routed).name_for("train") == "local"
    router("start"), router("end")
    assert made == ["local"], "one backend instance per name"
    with pytest.raises(ConfigError, match="no step nope"):
        StepRouter(Routed, default="slurm=nope")
    with pytest.raises(ConfigError, match="unknown backend"):
        StepRouter(Routed, default="kubernetes")
