"""A gang with hot spares seen from the client (stoker.client.gangs: Step/Task.generations, `stoker show`) and from
the goodput ledger (the loss to the next generation's first step is `recovery`), on synthetic store objects laid out
as stoker.distributed.gangboard writes them, with hand-computed answers."""

from __future__ import annotations

import gzip
import json

import pytest

from stoker.cli.goodput import ledger_lines
from stoker.cli.listing import show_lines
from stoker.client.gangs import gang_prefix, generation_lines, read_gang, step_gangs
from stoker.client.goodput import CATEGORIES, run_goodput
from stoker.store.blobs import LocalBlobStore
from stoker.store.goodput import ledger_prefix, ledger_segments
from stoker.store.manifest import Manifest, write_manifest

LOSS, FIRST = 1050.0, 1070.0  # node 1's member was lost at 1050; generation 1 did its first step at 1070


@pytest.fixture
def store(tmp_path) -> LocalBlobStore:
    return LocalBlobStore(tmp_path / "store")


def put(store, name: str, doc: dict) -> None:
    store.write(name, json.dumps(doc).encode())


def gang_objects(store, task: str = "2", attempt: int = 0, started_1: float | None = FIRST) -> None:
    g = gang_prefix("F", "1", "train", task, attempt)
    put(store, g + "gen-000000.json", {"gen": 0, "slots": [0, 1], "decided_at": 990.0, "lost": None, "joined": None})
    put(store, g + "gen-000001.json", {"gen": 1, "slots": [0, 2], "decided_at": 1050.5, "joined": 2, "lost": {
        "slot": 1, "member": 1, "host": "ip-10-0-0-2", "why": "lost: no heartbeat for 30 s", "at": LOSS}})
    put(store, g + "current.json", {"gen": 1, "slots": [0, 2], "decided_at": 1050.5, "joined": 2, "lost": None})
    put(store, g + "started-000000.json", {"gen": 0, "first_step_at": 1011.0})
    if started_1 is not None:
        put(store, g + "started-000001.json", {"gen": 1, "first_step_at": started_1})
    for m, host in enumerate(("ip-10-0-0-1", "ip-10-0-0-2", "ip-10-0-0-3")):
        put(store, g + f"member-{m}.json", {"member": m, "addr": "10.0.0.1", "host": host, "state": "active",
                                            "at": 1.0})
    put(store, g + "end.json", {"state": "done", "at": 1201.0})


def manifest(store, task: str, started: float, node: int) -> None:
    write_manifest(store, Manifest(flow="F", run_id="1", step="train", task_id=task, attempt=0, status="ok",
                                   started_at=started, finished_at=1200.0, artifacts={},
                                   parallel={"node_index": node, "num_nodes": 2}))


def snap(created: float, time_: float, *, start: int, step: int, committed: int, final: bool, proc: float,
         loop: float, **seconds: float) -> dict:
    secs = {"init": 0.0, "checkpoint_load": 0.0, "steps": 0.0, "checkpoint_save": 0.0, "eval": 0.0, **seconds}
    assert abs(sum(secs.values()) - (time_ - created)) < 1e-9
    return {"kind": "ledger", "version": 1, "time": time_, "created_at": created, "process_started_at": proc,
            "loop_started_at": loop, "final": final, "seconds": secs, "start_step": start, "step": step,
            "committed_step": committed, "tokens_per_step": 100, "saves": 2, "checkpoint_every": 10, "node": 0}


def trainers(store, task: str, *snaps: dict) -> None:
    """Each trainer process appends its chunk to the attempt's one series (the next sequence number)."""
    for i, s in enumerate(snaps, 1):
        store.write(ledger_prefix("F", "1", "train", task, 0) + f"{i:06d}.jsonl.gz",
                    gzip.compress((json.dumps(s) + "\n").encode()))


def a_run(store) -> None:
    """Node 0 (task 2) survives: its trainer runs on 2 s past the loss, then restarts from step 30. Node 1 (task 3):
    member 1 is killed at 1050 (its last snapshot at 1049, step 36), spare member 2 starts the task at 1055."""
    gang_objects(store)
    manifest(store, "2", 1000.0, 0)
    trainers(store, "2",
             snap(1005, 1052, start=0, step=40, committed=30, final=True, proc=1002, loop=1010, init=5, steps=40,
                  checkpoint_save=2),
             snap(1060, 1190, start=30, step=150, committed=150, final=True, proc=1058, loop=1066, init=4,
                  checkpoint_load=2, steps=120, checkpoint_save=4))
    manifest(store, "3", 1055.0, 1)
    trainers(store, "3",
             snap(1006, 1049, start=0, step=36, committed=30, final=False, proc=1002, loop=1011, init=5, steps=36,
                  checkpoint_save=2),
             snap(1062, 1190, start=30, step=150, committed=150, final=True, proc=1059, loop=1068, init=3,
                  checkpoint_load=3, steps=118, checkpoint_save=4))


def test_the_generations_of_a_gang_attempt(store):
    gang_objects(store)
    gang = read_gang(store, "F", "1", "train", "2", 0)
    assert {k: gang[k] for k in ("step", "task_id", "attempt", "nodes", "members", "spares", "ended")} == {
        "step": "train", "task_id": "2", "attempt": 0, "nodes": 2, "members": [0, 1, 2], "spares": 1, "ended": "done"}
    g0, g1 = gang["generations"]
    assert g0["lost"] is None and g0["recovery_s"] is None and g0["started_at"] == 1011.0
    assert g1["slots"] == [0, 2] and g1["joined"] == 2 and g1["joined_host"] == "ip-10-0-0-3"
    assert g1["lost"]["slot"] == 1 and g1["lost"]["member"] == 1 and g1["lost"]["host"] == "ip-10-0-0-2"
    assert g1["recovery_s"] == pytest.approx(FIRST - LOSS)
    assert step_gangs(store, "F", "1") == [gang] == step_gangs(store, "F", "1", "train")
    assert step_gangs(store, "F", "1", "start") == [] and read_gang(store, "F", "1", "train", "3", 0) is None
    assert generation_lines(gang) == [
        "gang (attempt 0): 2 nodes + 1 spare, 2 generations, 1 node replaced",
        "generation 0: members 0, 1 run nodes 0-1",
        "generation 1: node 1 left (member 1, host ip-10-0-0-2): lost: no heartbeat for 30 s; spare member 2 (host "
        "ip-10-0-0-3) took its place; recovered in 20.0 s"]


def test_a_generation_not_training_yet_and_torn_objects(store):
    gang_objects(store, started_1=None)
    store.write(gang_prefix("F", "1", "train", "2", 0) + "gen-000002.json", b'{"gen": 2, "slo')  # being written
    gang = read_gang(store, "F", "1", "train", "2", 0)
    assert [g["gen"] for g in gang["generations"]] == [0, 1]
    assert gang["generations"][1]["recovery_s"] is None
    assert generation_lines(gang)[-1].endswith("took its place; not training yet")


def test_show_lists_the_generations_under_the_step(store):
    gang_objects(store)
    rec = {"pathspec": "F/1", "status": "succeeded", "user": "u", "duration_s": 3.0, "origin_run_id": None,
           "tags": [], "parameters": {}, "cost": None, "goodput": None,
           "steps": [{"name": "train", "generations": step_gangs(store, "F", "1", "train"),
                      "tasks": [{"id": "2", "attempt": 0, "successful": True, "exception": None, "artifacts": []}]}]}
    lines = show_lines(rec, None, 80)
    assert all(len(line) <= 80 for line in lines), lines
    text = "\n".join(lines)
    assert "    gang (attempt 0): 2 nodes + 1 spare, 2 generations, 1 node replaced" in text
    assert "generation 1: node 1 left (member 1, host ip-10-0-0-2): lost: no heartbeat" in text
    assert "recovered in 20.0 s" in " ".join(line.strip() for line in lines)


def test_each_trainer_of_an_attempt_is_a_segment(store):
    a_run(store)
    segs = ledger_segments(store, "F", "1", "train", "3", 0)
    assert [s["created_at"] for s in segs] == [1006, 1062]


def test_the_ledger_counts_the_loss_to_the_next_first_step_as_recovery(store):
    a_run(store)
    doc = run_goodput(store, "F", "1")
    (step,) = doc["steps"]
    n0, n1 = step["tasks"]
    (a0,) = n0["attempts"]
    zero = dict.fromkeys(CATEGORIES, 0.0)
    # node 0: start-up 1000->1005 + init 5; generation 0's 40 steps less the 2 s past the loss (0.95 s each), kept
    # to 30 (where generation 1 resumed); recovery 1050->1070; generation 1's steps less its first 4 s (recovery)
    assert a0["seconds"] == pytest.approx({**zero, "startup": 10, "productive": 28.5 + 116, "lost": 9.5,
                                           "checkpoint_save": 6, "recovery": 20, "shutdown": 10})
    assert a0["wall_s"] == 200 and a0["steps"]["first"] == 0 and a0["steps"]["kept"] == 150
    assert a0["steps"]["lost"] == 10 and a0["saves"] == 4 and a0["generations"] == 2
    # node 1: the slot counts from the gang's start (node 0's); member 1's steps 30->36 and its last second are lost
    (a1,) = n1["attempts"]
    assert a1["seconds"] == pytest.approx({**zero, "startup": 11, "productive": 30 + 116, "lost": 7,
                                           "checkpoint_save": 6, "recovery": 20, "shutdown": 10})
    assert a1["wall_s"] == 200 and n1["begin"] == 1000
    for node in (n0, n1):
        assert sum(node["seconds"].values()) == pytest.approx(node["wall_s"])
    assert sum(doc["total"]["seconds"].values()) == pytest.approx(doc["total"]["node_seconds"])
    assert step["tokens"] == 150 * 100
    assert [g["task_id"] for g in step["generations"]] == ["2"]
    text = "\n".join(ledger_lines(doc))
    assert "recovery" in text and "lost work" in text


def test_a_gang_without_a_loss_is_accounted_as_before(store):
    g = gang_prefix("F", "1", "train", "2", 0)
    put(store, g + "gen-000000.json", {"gen": 0, "slots": [0, 1], "decided_at": 990.0, "lost": None, "joined": None})
    manifest(store, "2", 1000.0, 0)
    trainers(store, "2", snap(1005, 1190, start=0, step=150, committed=150, final=True, proc=1002, loop=1010,
                              init=5, steps=176, checkpoint_save=4))
    (a0,) = run_goodput(store, "F", "1")["steps"][0]["tasks"][0]["attempts"]
    assert a0["seconds"]["recovery"] == 0 and a0["seconds"]["productive"] == 176 and "generations" not in a0


def test_a_slot_a_spare_took_is_not_queued_before_the_take_over(store):
    """Issue 34, item 11: the gang's job was submitted at 990 (Slurm: no engine start); node 0 started at 1000, the
    spare's task at 1055. The slot queued 10 s like node 0, not the 65 s to the take-over (unpaid: goodput would be
    inflated), and no category is negative."""
    from stoker.client.goodput import JOBS
    from stoker.store.manifest import run_prefix

    a_run(store)
    ref = {"backend": "slurm", "job_id": "7", "members": 3, "kind": "gang", "step": "train", "task_ids": ["2", "3"],
           "attempt": 0, "submitted_at": 990.0, "extra": {}}
    put(store, run_prefix("F", "1") + JOBS + "slurm-7.json", ref)
    doc = run_goodput(store, "F", "1")
    n0, n1 = doc["steps"][0]["tasks"]
    for node in (n0, n1):
        (a,) = node["attempts"]
        assert a["seconds"]["queue"] == 10 and a["wall_s"] == 210 and node["begin"] == 990
        assert min(a["seconds"].values()) >= 0 and a["seconds"]["other"] == pytest.approx(0, abs=1e-9)
    zero = dict.fromkeys(CATEGORIES, 0.0)
    assert n1["attempts"][0]["seconds"] == pytest.approx({**zero, "queue": 10, "startup": 11, "productive": 30 + 116,
                                                          "lost": 7, "checkpoint_save": 6, "recovery": 20,
                                                          "shutdown": 10})
    assert doc["total"]["paid_s"] == 400 and not doc["notes"]


def test_a_loss_a_spare_absorbed_is_a_failure_for_the_checkpoint_advice(store, monkeypatch):
    """Issue 34, item 14: the attempt succeeded, but node 1 was lost (a spare took its slot): the MTBF the advice
    uses is observed from that one failure (node 0's 200 s paid), never the assumed 12 h."""
    monkeypatch.delenv("STOKER_MTBF_HOURS", raising=False)
    a_run(store)
    step = run_goodput(store, "F", "1")["steps"][0]
    advice = step["checkpoint"]["advice"]
    assert advice["mtbf_source"] == "observed" and advice["failures"] == 1 and advice["mtbf_s"] == pytest.approx(200)
    assert step["failures"] == 1 and step["mtbf_s"] == pytest.approx(200)
