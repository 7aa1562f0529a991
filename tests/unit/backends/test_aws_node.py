"""The Batch node entrypoint's own parts (backends/aws/node.py): each node's own address, and the main node of a gang
with hot spares outliving the gang (Batch ends a multi-node job when its main node exits)."""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest

from stoker.backends.aws import node as batch_node
from stoker.backends.aws.node import BATCH, spare_main_node_exits, wait_for_gang_end, wait_for_members
from stoker.distributed.gangboard import GangBoard
from stoker.runtime.contract import Unit
from stoker.runtime.member.nodeenv import node_identity
from stoker.runtime.spec import GangSlot, TaskSpec
from stoker.store.blobs import open_store
from stoker.store.manifest import log_name

CHILD = {"AWS_BATCH_JOB_NODE_INDEX": "2", "AWS_BATCH_JOB_NUM_NODES": "3", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
         "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.0.1.5"}
MAIN = {"AWS_BATCH_JOB_NODE_INDEX": "0", "AWS_BATCH_JOB_NUM_NODES": "3", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0"}


@pytest.fixture(autouse=True)
def fresh_address_cache():
    batch_node._own_address.cache_clear()
    yield
    batch_node._own_address.cache_clear()


@pytest.fixture
def ecs_metadata():
    """The ECS agent's task metadata endpoint (v4), container path, as it answers in awsvpc mode."""
    doc = {"DockerId": "abc", "Name": "default", "Networks": [
        {"NetworkMode": "awsvpc", "IPv4Addresses": ["10.0.1.23"], "PrivateDNSName": "ip-10-0-1-23.ec2.internal"}]}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = json.dumps(doc).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v4/abc"
    server.shutdown()


def test_every_node_knows_its_own_address(ecs_metadata):
    """Batch tells the child nodes the main node's address and no node its own: it comes from the ECS task metadata
    endpoint (the job's network interface), the main node's rendezvous address being its own."""
    child = node_identity({**CHILD, "ECS_CONTAINER_METADATA_URI_V4": ecs_metadata}, BATCH)
    assert (child.member, child.num_nodes, child.main_addr, child.addr, child.port) == (2, 3, "10.0.1.5",
                                                                                        "10.0.1.23", 29500)
    main = node_identity({**MAIN, "ECS_CONTAINER_METADATA_URI_V4": ecs_metadata}, BATCH)
    assert main.member == 0 and main.main_addr == main.addr == "10.0.1.23"


def test_without_the_metadata_endpoint_the_host_name_says(monkeypatch):
    monkeypatch.setattr(batch_node.socket, "gethostname", lambda: "ip-10-0-1-9")
    monkeypatch.setattr(batch_node.socket, "gethostbyname", lambda name: "10.0.1.9" if name == "ip-10-0-1-9" else "")
    dead = "http://127.0.0.1:9/v4/none"  # nothing listens on the discard port: refused at once
    assert node_identity({**CHILD, "ECS_CONTAINER_METADATA_URI_V4": dead}, BATCH).addr == "10.0.1.9"
    batch_node._own_address.cache_clear()
    main = node_identity(MAIN, BATCH)
    assert main.addr == main.main_addr == "10.0.1.9"


def gang_doc(spares: int) -> dict:
    specs = [TaskSpec(flow="F", run_id="1", step="train", task_id=str(5 + i), attempt=0, parallel=slot)
             for i, slot in enumerate(GangSlot.gang(2, "5"))]
    unit = Unit(kind="gang", flow="F", run_id="1", step="train", specs=specs, spares=spares,
                first_slots=[1, 2] if spares else [])
    return json.loads(unit.spec_document())


def final_logs(store, doc: dict) -> None:
    for s in doc["specs"]:
        store.write(log_name("F", "1", "train", s["task_id"], 0, "stderr"), b"done\n")


def later(seconds: float, fn) -> threading.Thread:
    t = threading.Thread(target=lambda: (time.sleep(seconds), fn()), daemon=True)
    t.start()
    return t


def test_the_main_node_of_a_gang_with_spares_waits_for_every_slot(tmp_path):
    """It ran a lost node's slot: its task is done, but it may exit (which ends the job) only once every slot's node
    wrote its final log, whichever member ran it. Not for end.json: the run writes it only after the main node's
    member exited (a remote task is over when its member exits). A child node never waits."""
    store, doc = open_store(tmp_path / "store"), gang_doc(spares=1)
    spec = TaskSpec.from_dict(doc["specs"][1])
    started = time.monotonic()
    later(0.6, lambda: final_logs(store, doc))
    wait_for_members(store, doc, spec, MAIN, poll_s=0.05)
    assert 0.5 < time.monotonic() - started < 5
    child = time.monotonic()
    wait_for_members(store, doc, spec, CHILD, poll_s=0.05)
    assert time.monotonic() - child < 0.5, "a child node never waits"


def test_a_stopped_gang_lets_the_main_node_go_at_once(tmp_path):
    """The run stopped the gang (a node failed on its own, or no spare was left): the others' logs may never come."""
    store, doc = open_store(tmp_path / "store"), gang_doc(spares=1)
    board = GangBoard.of(store, "F", "1", "train", "5", 0)
    later(0.3, lambda: board.end("stopped"))
    started = time.monotonic()
    assert wait_for_gang_end(store, doc, MAIN, poll_s=0.05) == "stopped"
    assert 0.2 < time.monotonic() - started < 2
    other, doc2 = open_store(tmp_path / "other"), gang_doc(spares=1)
    GangBoard.of(other, "F", "1", "train", "5", 0).end("done")
    later(0.5, lambda: final_logs(other, doc2))
    started = time.monotonic()
    assert wait_for_gang_end(other, doc2, MAIN, poll_s=0.05) == "logs", "a done gang: its nodes' last logs first"
    assert time.monotonic() - started >= 0.4


def test_the_wait_is_bounded(tmp_path, capfd):
    store, doc = open_store(tmp_path / "store"), gang_doc(spares=1)
    started = time.monotonic()
    assert wait_for_gang_end(store, doc, {**MAIN, "STOKER_MAIN_NODE_WAIT": "0.3"}, poll_s=0.05) is None
    assert time.monotonic() - started < 2
    assert "did not finish within STOKER_MAIN_NODE_WAIT" in capfd.readouterr().err


def test_without_spares_the_main_node_waits_for_the_others_logs_as_before(tmp_path):
    store, doc = open_store(tmp_path / "store"), gang_doc(spares=0)
    later(0.4, lambda: final_logs(store, doc))
    started = time.monotonic()
    wait_for_members(store, doc, TaskSpec.from_dict(doc["specs"][0]), MAIN, poll_s=0.05)
    assert 0.3 < time.monotonic() - started < 5


def test_an_unused_spare_main_node_lets_the_gang_finish_its_logs(tmp_path):
    """The main node leaves the standby when the driver writes end.json (runtime/member/standby.py), with
    SystemExit(0) from the agent: its exit would end the job, so it waits for the nodes' final logs first."""
    store, doc = open_store(tmp_path / "store"), gang_doc(spares=1)
    key = store.put_blob(json.dumps(doc).encode())
    GangBoard.of(store, "F", "1", "train", "5", 0).end("done")
    later(0.5, lambda: final_logs(store, doc))
    argv = ["--store", str(tmp_path / "store"), "--code", "x", "--spec", key]
    started = time.monotonic()
    spare_main_node_exits(argv, MAIN, poll_s=0.05)
    assert time.monotonic() - started >= 0.4
    started = time.monotonic()
    spare_main_node_exits(argv, CHILD, poll_s=0.05)  # a child's exit ends nothing
    spare_main_node_exits(["--store", str(tmp_path / "nowhere"), "--spec", "sha256-none"], MAIN)  # never raises
    assert time.monotonic() - started < 1
