"""The parts of hot spares that need no gang (issue 26): the generation objects in a real store (gangboard), the
first slots of each engine, how the driver picks a spare and replaces a lost member (runtime/driver/spares.py, with
a real NodeWatch and store, the scheduler's tasks as plain objects), a spare that waits for a slot or for the end
(runtime/member/standby.py, a thread posting the generation), and `member_spec` of a unit with spares."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import pytest

from stoker.distributed.gangboard import GangBoard, Generation, first_slots
from stoker.runtime.contract import EXITED, RUNNING, JobRef, JobStatus, Unit
from stoker.runtime.driver.lostnodes import NodeWatch
from stoker.runtime.driver.spares import Spares
from stoker.runtime.member.node import member_spec
from stoker.runtime.member.nodeenv import NodeIdentity
from stoker.runtime.member.standby import wait_for_slot
from stoker.runtime.spec import GangSlot, TaskSpec
from stoker.store.blobs import open_store


@pytest.fixture
def store(tmp_path):
    return open_store(str(tmp_path / "store"))


def specs(n: int, store_url: str) -> list[TaskSpec]:
    return [TaskSpec(flow="F", run_id="1", step="train", task_id=str(10 + i), store_url=store_url,
                     parallel=slot) for i, slot in enumerate(GangSlot.gang(n, "10"))]


def test_generations_round_trip_in_the_store(store):
    board = GangBoard.of(store, "F", "1", "train", "10", 0)
    assert board.current() is None and board.ended() is None
    board.post(Generation(0, [0, 1]))
    board.post(Generation(1, [2, 1], lost={"slot": 0, "member": 0, "host": "a", "why": "x", "at": 5.0}, joined=2))
    assert board.current().slots == [2, 1] and board.current().slot_of(2) == 0 and board.current().slot_of(0) is None
    assert [g.gen for g in board.history()] == [0, 1] and board.generation(0).slots == [0, 1]
    board.mark_started(1, 12.5)
    board.report_failure(1, 1)
    board.request_eviction(1, {"node": 1})
    board.announce(2, "10.0.0.3", "n3", "standby")
    board.end("done")
    assert board.started(1) == 12.5 and list(board.failures(1)) == [1] and board.eviction(1) == {"node": 1}
    assert board.member(2)["addr"] == "10.0.0.3" and board.ended() == "done"
    assert board.prefix == "runs/F/1/train/10/0/gang/"


def test_first_slots_keep_the_main_node_last_where_its_exit_ends_the_job():
    assert first_slots(2, 1) == [0, 1]
    assert first_slots(2, 1, main_is_spare=True) == [1, 2]
    assert first_slots(3, 0, main_is_spare=True) == [0, 1, 2]  # no spare: nothing to keep


def _gang(store, remote: bool = False, main_node_spare: bool = False):
    said: list[str] = []
    watch = NodeWatch(store, "F", "1", timeout=6.0)
    spares = Spares(store, "F", "1", lambda text, style: said.append(text), watch)
    unit = Unit(kind="gang", flow="F", run_id="1", step="train", specs=specs(2, store.url))
    spares.prepare(unit, 1, main_node_spare)
    ref = JobRef("local", "j1", members=unit.nodes, kind="gang", step="train")
    spares.track(ref, unit, remote)
    tasks = [SimpleNamespace(state="running", job=ref, stopping=False, step="train", parallel=s.parallel,
                             member=unit.first_slots[i], task_id=s.task_id, attempt=0)
             for i, s in enumerate(unit.specs)]
    return spares, unit, ref, tasks, said


def test_prepare_gives_members_and_posts_generation_zero(store):
    spares, unit, ref, tasks, _ = _gang(store, main_node_spare=True)
    assert unit.nodes == 3 and unit.first_slots == [1, 2]
    assert [s.parallel.member for s in unit.specs] == [1, 2] and all(s.parallel.spares == 1 for s in unit.specs)
    assert GangBoard.of(store, "F", "1", "train", "10", 0).current().slots == [1, 2]
    assert '"spares": 1' in unit.spec_document().decode()


def test_a_killed_member_is_replaced_by_the_live_spare(store):
    spares, unit, ref, tasks, said = _gang(store)
    status = JobStatus(RUNNING, members={0: JobStatus(RUNNING), 1: JobStatus(EXITED, exit_code=-9),
                                         2: JobStatus(RUNNING)})
    spares.check(ref, tasks, status, time.time())
    assert tasks[1].member == 2 and tasks[0].member == 0
    gen = GangBoard.of(store, "F", "1", "train", "10", 0).current()
    assert gen.gen == 1 and gen.slots == [0, 2] and gen.lost["member"] == 1 and gen.joined == 2
    assert "killed by signal 9; spare member 2 takes its place in generation 1" in said[-1]
    # the spare lost too: none left, the gang fails as one (the scheduler then sees member 2's exit)
    status.members[2] = JobStatus(EXITED, exit_code=-9)
    spares.check(ref, tasks, status, time.time())
    assert "no spare left: the gang fails as one" in said[-1] and tasks[1].member == 2


def test_a_member_that_failed_on_its_own_is_not_replaced(store):
    """Exit 1 with its manifest (an error in training): the gang's own failure, handled as without spares."""
    spares, unit, ref, tasks, said = _gang(store)
    status = JobStatus(RUNNING, members={0: JobStatus(RUNNING), 1: JobStatus(EXITED, exit_code=1),
                                         2: JobStatus(RUNNING)})
    spares.check(ref, tasks, status, time.time())
    assert tasks[1].member == 1 and not said
    assert GangBoard.of(store, "F", "1", "train", "10", 0).current().gen == 0


def test_a_dead_spare_is_not_chosen_and_the_gang_end_is_posted(store):
    spares, unit, ref, tasks, said = _gang(store)
    status = JobStatus(RUNNING, members={0: JobStatus(EXITED, exit_code=-9), 1: JobStatus(RUNNING),
                                         2: JobStatus(EXITED, exit_code=0)})
    spares.check(ref, tasks, status, time.time())
    assert tasks[0].member == 0 and "no spare left" in said[-1]
    for t in tasks:
        t.state = "ok"
    spares.over(ref, tasks)
    assert GangBoard.of(store, "F", "1", "train", "10", 0).ended() == "done"


def test_a_remote_spare_must_have_announced_itself_lately(store):
    spares, unit, ref, tasks, said = _gang(store, remote=True)
    board = GangBoard.of(store, "F", "1", "train", "10", 0)
    status = JobStatus(RUNNING, members={0: JobStatus(RUNNING), 1: JobStatus(EXITED, exit_code=-9),
                                         2: JobStatus(RUNNING)})
    spares.check(ref, tasks, status, time.time())
    assert "no spare left" in said[-1]  # member 2 never said it waits
    board.announce(2, "10.0.0.3", "n3", "standby")
    spares.check(ref, tasks, status, time.time())
    assert tasks[1].member == 2 and board.current().slots == [0, 2]


def test_a_straggler_eviction_request_swaps_the_node(store):
    spares, unit, ref, tasks, said = _gang(store)
    board = GangBoard.of(store, "F", "1", "train", "10", 0)
    board.request_eviction(0, {"node": 0, "host": "a", "step": 8, "message": "straggler: node 0 (host a) slow"})
    status = JobStatus(RUNNING, members={i: JobStatus(RUNNING) for i in range(3)})
    spares.check(ref, tasks, status, time.time())
    assert tasks[0].member == 2 and board.current().lost["why"].startswith("evicted as a straggler after the "
                                                                           "checkpoint of step 8")


def test_a_spare_waits_for_its_slot(store):
    board = GangBoard.of(store, "F", "1", "train", "10", 0)
    board.post(Generation(0, [0, 1]))
    got: list = []
    ident = NodeIdentity(member=2, num_nodes=3, main_addr="127.0.0.1")
    t = threading.Thread(target=lambda: got.append(wait_for_slot(specs(2, store.url), ident, 1, board, 0.02)))
    t.start()
    time.sleep(0.2)
    assert board.member(2)["state"] == "standby" and not got
    board.post(Generation(1, [0, 2], joined=2))
    t.join(timeout=5)
    assert got == [1] and board.member(2)["state"] == "active"


def test_a_spare_that_was_not_needed_goes_home(store):
    board = GangBoard.of(store, "F", "1", "train", "10", 0)
    board.post(Generation(0, [0, 1]))
    board.end("done")
    ident = NodeIdentity(member=2, num_nodes=3, main_addr="127.0.0.1")
    assert wait_for_slot(specs(2, store.url), ident, 1, board, 0.02) is None
    doc = {"kind": "gang", "specs": specs(2, store.url), "spares": 1, "first_slots": [0, 1]}
    with pytest.raises(SystemExit) as e:
        member_spec(doc, {"STOKER_MEMBER": "2", "STOKER_NUM_NODES": "3", "STOKER_MAIN_ADDR": "127.0.0.1"})
    assert e.value.code == 0


def test_member_spec_of_an_active_member_of_a_gang_with_spares(store):
    GangBoard.of(store, "F", "1", "train", "10", 0).post(Generation(0, [1, 2]))
    doc = {"kind": "gang", "specs": specs(2, store.url), "spares": 1, "first_slots": [1, 2]}
    spec = member_spec(doc, {"STOKER_MEMBER": "2", "STOKER_NUM_NODES": "3", "STOKER_MAIN_ADDR": "10.0.0.1",
                             "STOKER_MAIN_PORT": "29500"})
    assert spec.task_id == "11" and spec.parallel.node_index == 1 and spec.parallel.num_nodes == 2
    assert spec.parallel.member == 2 and spec.parallel.main_ip == "10.0.0.1"
    assert GangBoard.of(store, "F", "1", "train", "10", 0).member(2)["state"] == "active"


def test_a_remote_member_that_ended_without_its_manifest_is_lost(store):
    """A killed container (Batch says 137) wrote no manifest: lost, replaced. One that wrote its manifest (its own
    failure) is not."""
    spares, unit, ref, tasks, said = _gang(store, remote=True)
    GangBoard.of(store, "F", "1", "train", "10", 0).announce(2, "10.0.0.3", "n3", "standby")
    status = JobStatus(RUNNING, members={0: JobStatus(RUNNING), 1: JobStatus(EXITED, exit_code=137, reason="x"),
                                         2: JobStatus(RUNNING)})
    store.write("runs/F/1/train/11/0/manifest.json", b"{}")  # node 1 failed on its own: it said so
    spares.check(ref, tasks, status, time.time())
    assert tasks[1].member == 1 and not said
    store.delete("runs/F/1/train/11/0/manifest.json")
    spares.check(ref, tasks, status, time.time())
    assert tasks[1].member == 2 and "ended with exit code 137 without a word of its task (x)" in said[-1]


def test_a_waiting_spare_prepares_what_node_0_prepared(store, tmp_path, capsys):
    """warm.json names the inputs node 0 staged and its Neuron cache: the spare stages them into the node's stage
    cache (a local folder is used where it is) while it waits; a failure is said, never fatal."""
    from stoker.runtime.member.standby import warm_up

    data = tmp_path / "data"
    data.mkdir()
    lines = warm_up({"stage": [str(data), str(tmp_path / "missing")], "neuron_cache": None, "store_url": None})
    assert len(lines) == 2 and "failed" in lines[1] and "the task stages it when it runs" in lines[1]
    fetched: list = []
    warm_up({"stage": [], "neuron_cache": "neuron-cache/", "store_url": store.url},
            fetch_fn=lambda url, prefix: fetched.append((url, prefix)))
    assert fetched == [(store.url, "neuron-cache/")]
    board = GangBoard.of(store, "F", "1", "train", "10", 0)
    board.post(Generation(0, [0, 1]))
    board.publish_warmup({"stage": [str(data)], "neuron_cache": None, "store_url": None})
    board.end("done")
    ident = NodeIdentity(member=2, num_nodes=3, main_addr="127.0.0.1")
    assert wait_for_slot(specs(2, store.url), ident, 1, board, 0.02) is None
    time.sleep(0.3)
    assert "spare warm-up:" in capsys.readouterr().err


def test_a_spare_runs_the_preflights_local_checks_while_it_waits(store, tmp_path, capsys):
    """warm.json carries what node 0's preflight checks: the spare checks the entrypoint's imports (a relative script
    found in its code package) and the data it staged. One that fails says `unfit` (and why) and is never given a
    slot; the driver says why it had no spare."""
    from stoker.runtime.member.standby import warm_up

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "train.py").write_text("import json\n")
    (pkg / "broken.py").write_text("import no_such_module_here\n")
    verdict: dict = {}
    lines = warm_up({"stage": [], "preflight": {"entrypoint": "train.py", "nnodes": 2}}, member=2,
                    package=str(pkg), verdict=verdict)
    assert lines == ["preflight ok"] and not verdict
    assert "stoker: spare preflight: node 2" in capsys.readouterr().err
    lines = warm_up({"stage": [], "preflight": {"entrypoint": "broken.py", "nnodes": 2}}, member=2,
                    package=str(pkg), verdict=verdict)
    assert lines[-1].startswith("unfit") and "no_such_module_here" in verdict["unfit"]
    assert "member 2 is not fit to take a node" in capsys.readouterr().err

    board = GangBoard.of(store, "F", "1", "train", "10", 0)
    board.post(Generation(0, [0, 1]))
    board.publish_warmup({"stage": [], "preflight": {"entrypoint": "broken.py", "nnodes": 2}})
    ident = NodeIdentity(member=2, num_nodes=3, main_addr="127.0.0.1")
    t = threading.Thread(target=wait_for_slot, args=(specs(2, store.url), ident, 1, board, 0.02),
                         kwargs={"package": str(pkg)}, daemon=True)
    t.start()
    deadline = time.time() + 20
    while (board.member(2) or {}).get("state") != "unfit" and time.time() < deadline:
        time.sleep(0.05)
    rec = board.member(2)
    assert rec["state"] == "unfit" and "no_such_module_here" in rec["why"]
    board.end("done")
    t.join(timeout=5)


def test_an_unfit_spare_is_not_chosen(store):
    spares, unit, ref, tasks, said = _gang(store)
    GangBoard.of(store, "F", "1", "train", "10", 0).announce(2, "10.0.0.3", "n3", "unfit", why="no GPUs here")
    status = JobStatus(RUNNING, members={0: JobStatus(RUNNING), 1: JobStatus(EXITED, exit_code=-9),
                                         2: JobStatus(RUNNING)})
    spares.check(ref, tasks, status, time.time())
    assert tasks[1].member == 1 and "no spare left (member 2 is unfit: no GPUs here)" in said[-1]


def test_a_spare_that_takes_a_node_keeps_the_lost_members_log(store, tmp_path):
    """The lost member shipped two chunks of its stderr; the spare running the same attempt ships after them, and its
    whole log starts with them and says who took over (a real LogShipper on fd 1 and 2, in a child process)."""
    import subprocess
    import sys

    from stoker.runtime.member.node import part_name
    from stoker.store.manifest import log_name

    name = log_name("F", "1", "train", "11", 0, "stderr")
    store.write(part_name(name, 1), b"lost member: step 1\n")
    store.write(part_name(name, 2), b"lost member: step 2\n")
    code = f"""
import sys
from dataclasses import replace
from stoker.runtime.member.node import LogShipper
from stoker.runtime.spec import GangSlot, TaskSpec
from stoker.store.blobs import open_store
slot = GangSlot.gang(2, "10")[1].with_spares(1, 2)
spec = TaskSpec(flow="F", run_id="1", step="train", task_id="11", store_url={store.url!r}, parallel=slot)
ship = LogShipper(open_store({store.url!r}), spec)
print("spare: resumed", file=sys.stderr, flush=True)
ship.close()
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert store.read(name) == (b"lost member: step 1\nlost member: step 2\nstoker: member 2 takes node 1 over; the "
                                b"lines above are the lost member's\nspare: resumed\n")
    assert not store.exists(part_name(name, 1)) and not store.exists(part_name(name, 3))


def test_between_two_engine_polls_the_beats_are_read_and_a_lost_node_replaced(store):
    """Slurm is polled once a second at most; a gang with spares' heartbeats are read every READ_BEATS_S between
    two polls (`recheck`, with what the engine said last), so a silent node's slot goes to a spare without waiting
    for the next sacct."""
    from stoker.runtime.driver.spares import READ_BEATS_S
    from stoker.runtime.member.heartbeat import heartbeat_name

    spares, unit, ref, tasks, said = _gang(store, remote=True)
    board = GangBoard.of(store, "F", "1", "train", "10", 0)
    board.announce(2, "10.0.0.3", "n3", "standby")
    t0 = time.time()

    def beat(node: int, at: float) -> None:
        doc = {"node": node, "host": f"n{node + 1}", "member": tasks[node].member, "interval": 0.5, "at": at,
               "state": "running", "seq": at}
        store.write(heartbeat_name("F", "1", "train", tasks[node].task_id, 0), json.dumps(doc).encode())

    beat(0, t0)
    beat(1, t0)
    status = JobStatus(RUNNING, members={m: JobStatus(RUNNING) for m in range(3)})  # all the engine will say
    spares.check(ref, tasks, status, t0)
    assert spares.due(t0) == pytest.approx(t0 + READ_BEATS_S)
    spares.recheck(t0 + READ_BEATS_S / 2)  # not due: nothing read
    assert tasks[1].member == 1 and not said
    beat(0, t0 + 0.5)  # node 0 beats on and says its ranks failed after node 1's last beat; node 1 is silent
    board.report_failure(0, 0)
    spares.recheck(t0 + 0.6)
    assert tasks[1].member == 1  # silent for less than two beats yet
    beat(0, t0 + 1.0)
    spares.recheck(t0 + 1.3)  # no new status from the engine: the beats alone
    assert tasks[1].member == 2 and board.current().slots == [0, 2], said
    assert "no heartbeat for 1 s; spare member 2 takes its place in generation 1" in said[-1], said
