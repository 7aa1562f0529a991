"""Issue 25: a lost gang node is found from the node agents' heartbeats (runtime/member/heartbeat.py) and judged by the
driver's clock (runtime/driver/lostnodes.py): silent for the timeout while another node is alive or has ended -> lost,
naming its host; never when every node is silent, when it ended, or when it went silent only after another failed."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from stoker.runtime.driver.lostnodes import NodeWatch, lost_why
from stoker.runtime.member.heartbeat import Heartbeat, beat_interval, heartbeat_name, heartbeat_timeout
from stoker.runtime.spec import GangSlot, TaskSpec
from stoker.store.manifest import manifest_name


class Store:
    """The part of a BlobStore the watch and the heartbeat use, in memory."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.broken = False

    def write(self, name: str, data: bytes, durable: bool = True) -> None:
        if self.broken:
            raise OSError("store unreachable")
        self.objects[name] = data

    def read(self, name: str) -> bytes:
        if self.broken:
            raise OSError("store unreachable")
        return self.objects[name]

    def exists(self, name: str) -> bool:
        if self.broken:
            raise OSError("store unreachable")
        return name in self.objects


@dataclass
class Ref:
    job_id: str = "7"


@dataclass
class Task:
    task_id: str
    job: object
    step: str = "train"
    attempt: int = 0
    state: str = "running"
    stopping: bool = False
    started: float = 0.0
    parallel: object = None
    manifest: dict = field(default_factory=dict)


def _gang(n: int = 2):
    ref = Ref()
    return ref, [Task(str(10 + i), ref) for i in range(n)]


def _beat(store: Store, t: Task, node: int, seq: int, at: float, state: str = "running", code: int | None = None):
    doc = {"node": node, "host": f"n{node + 1}", "seq": seq, "at": at, "state": state}
    if code is not None:
        doc["code"] = code
    store.write(heartbeat_name("F", "R", t.step, t.task_id, t.attempt), json.dumps(doc).encode())


def _watch(store: Store) -> NodeWatch:
    return NodeWatch(store, "F", "R", timeout=6.0)


def test_a_node_silent_for_the_timeout_while_the_other_beats_is_lost_and_named():
    store, (ref, tasks) = Store(), _gang()
    w = _watch(store)
    for i, t in enumerate(tasks):
        _beat(store, t, i, 1, 100.0)
    assert w.lost(ref, tasks, 1000.0) is None
    for k, now in enumerate((1002.0, 1004.0, 1006.0, 1006.5)):
        _beat(store, tasks[0], 0, 2 + k, 100.0 + now - 1000)  # node 0 goes on beating, node 1 is silent
        lost = w.lost(ref, tasks, now)
        assert lost is None or now > 1006.0
    assert lost is not None and lost.node == 1 and lost.host == "n2" and lost.silent_s == 6.5
    assert lost.message() == "node 1 (host n2) lost: no heartbeat for 6 s"
    assert lost.last_beat == 100.0  # its own time of its last beat: the gang's first failure on record


def test_a_silent_node_is_lost_when_the_survivors_failed_after_it_went_silent():
    store, (ref, tasks) = Store(), _gang()
    w = _watch(store)
    for i, t in enumerate(tasks):
        _beat(store, t, i, 1, 100.0)
    w.lost(ref, tasks, 1000.0)
    _beat(store, tasks[0], 0, 2, 102.4, state="ended", code=1)  # its torchrun failed 2.4 s after node 1's last beat
    assert w.lost(ref, tasks, 1003.5) is None
    lost = w.lost(ref, tasks, 1004.5)  # the survivors reported the collective it left: two missed beats are enough
    assert lost is not None and lost.node == 1 and lost.silent_s == 4.5


def test_no_node_is_lost_when_all_are_silent_or_when_a_silent_one_ended():
    store, (ref, tasks) = Store(), _gang()
    w = _watch(store)
    for i, t in enumerate(tasks):
        _beat(store, t, i, 1, 100.0)
    w.lost(ref, tasks, 1000.0)
    assert w.lost(ref, tasks, 1010.0) is None, "every node silent: the store or this host, not a node"
    # node 1 silent, node 0 alive, but node 1 wrote its manifest: it ended (its last beat was lost)
    _beat(store, tasks[0], 0, 2, 110.0)
    store.write(manifest_name("F", "R", "train", tasks[1].task_id, 0), b"{}")
    assert w.lost(ref, tasks, 1011.0) is None
    tasks[1].stopping = True  # stoker is stopping it: silence is expected
    store.objects.clear()
    assert w.lost(ref, tasks, 1020.0) is None


def test_a_node_killed_within_a_beat_of_the_survivors_failure_is_still_lost():
    """A SIGKILLed host's peers see their sockets reset at once: their failure lands within one beat of its last."""
    store, (ref, tasks) = Store(), _gang()
    w = _watch(store)
    _beat(store, tasks[0], 0, 1, 100.0)
    _beat(store, tasks[1], 1, 1, 100.5)
    w.lost(ref, tasks, 1000.0)
    _beat(store, tasks[0], 0, 2, 101.0, state="ended", code=1)
    lost = w.lost(ref, tasks, 1006.5)
    assert lost is not None and lost.node == 1


def test_a_paused_driver_or_an_unreadable_store_never_makes_a_node_lost():
    store, (ref, tasks) = Store(), _gang()
    w = _watch(store)
    for i, t in enumerate(tasks):
        _beat(store, t, i, 1, 100.0)
    w.lost(ref, tasks, 1000.0)
    for i, t in enumerate(tasks):  # the nodes went on beating while this driver was stopped for a minute
        _beat(store, t, i, 30, 160.0)
    assert w.lost(ref, tasks, 1060.0) is None
    store.broken = True
    assert w.lost(ref, tasks, 1070.0) is None
    store.broken = False
    assert w.lost(ref, tasks, 1071.0) is None, "an unreadable beat counts as a live one"


def test_a_node_that_has_not_beaten_yet_is_not_judged():
    store, (ref, tasks) = Store(), _gang(3)
    w = _watch(store)
    _beat(store, tasks[0], 0, 1, 100.0)
    _beat(store, tasks[1], 1, 1, 100.0)
    w.lost(ref, tasks, 1000.0)
    _beat(store, tasks[0], 0, 9, 120.0)
    lost = w.lost(ref, tasks, 1020.0)
    assert lost is not None and lost.node == 1, "node 2 never beat (still starting): only node 1 is judged"


def test_lost_why_reads_a_lost_nodes_manifest():
    t = Task("1", None, manifest={"exception": {"type": "NodeLost", "message": "node 1 (host n2) lost: x"}})
    assert lost_why(t) == "node 1 (host n2) lost: x"
    assert lost_why(Task("2", None, manifest={"exception": {"type": "TaskDied", "message": "m"}})) is None


def test_the_heartbeat_beats_for_a_gang_node_and_ends_with_its_code(monkeypatch):
    monkeypatch.setenv("STOKER_HEARTBEAT_TIMEOUT", "0.6")
    assert heartbeat_timeout() == 1.0 and beat_interval() == 1 / 3  # at least 1 s; three beats a timeout
    monkeypatch.setenv("STOKER_HEARTBEAT_TIMEOUT", "bad")
    assert heartbeat_timeout() == 6.0 and beat_interval() == 2.0
    assert heartbeat_timeout(object_store=True) == 20.0, "an S3 write can stall for seconds"
    monkeypatch.delenv("STOKER_HEARTBEAT_TIMEOUT")
    assert NodeWatch(Store(), "F", "R").timeout == 6.0  # a store in a folder
    s3 = Store()
    s3.root = None
    assert NodeWatch(s3, "F", "R").timeout == 20.0
    store = Store()
    spec = TaskSpec(flow="F", run_id="R", step="train", task_id="11", store_url="x",
                    parallel=GangSlot.gang(2, "10")[1])
    beat = Heartbeat(interval=0.05)
    beat.start(store, spec, host="n2")
    name = heartbeat_name("F", "R", "train", "11", 0)
    first = json.loads(store.read(name))
    assert first["node"] == 1 and first["host"] == "n2" and first["state"] == "running"
    time.sleep(0.3)
    assert json.loads(store.read(name))["seq"] > first["seq"]
    beat.stop(3)
    last = json.loads(store.read(name))
    assert last["state"] == "ended" and last["code"] == 3
    time.sleep(0.15)
    assert json.loads(store.read(name)) == last, "nothing is written after the last beat"


def test_only_gang_nodes_beat():
    store = Store()
    beat = Heartbeat(interval=0.05)
    beat.start(store, TaskSpec(flow="F", run_id="R", step="s", task_id="1", store_url="x"))
    one = TaskSpec(flow="F", run_id="R", step="s", task_id="2", store_url="x", parallel=GangSlot.gang(1, "2")[0])
    beat.start(store, one)
    beat.stop(0)
    assert store.objects == {}


class Sched:
    """What gang_failed uses of the scheduler."""

    def __init__(self, gang: list) -> None:
        self.gang, self.gang_failures, self.lines, self.stops, self.after = gang, {}, [], [], []
        self.display = self

    def info(self, line: str, style: str = "") -> None:
        self.lines.append(line)

    def _gang(self, t):
        return self.gang

    def _why(self, t) -> str:
        exc = t.manifest.get("exception") or {}
        return f"{exc.get('type')}: {exc.get('message')}"

    def _stop(self, g, reason: str) -> None:
        self.stops.append((g.task_id, reason))

    def _again_or_fail(self, gang, first) -> None:
        self.after.append(first.task_id)


def _slotted(task_id: str, node: int, state: str, exc: dict | None = None) -> Task:
    t = Task(task_id, Ref(), state=state, parallel=GangSlot.gang(2, "10")[node], manifest={"exception": exc or {}})
    t.gang = "g"
    return t


def test_the_others_are_stopped_with_a_sentence_naming_the_failed_or_lost_node():
    from stoker.runtime.driver.fallback import crash_note
    from stoker.runtime.driver.lostnodes import gang_failed

    for exc, said, why in [({"type": "RuntimeError", "message": "boom"}, "node 1 (task 11) failed: RuntimeError: boom",
                            "node 1 of its gang failed"),
                           ({"type": "NodeLost", "message": "node 1 (host n2) lost: no heartbeat for 6 s"},
                            "node 1 (host n2) lost: no heartbeat for 6 s", "node 1 of its gang was lost")]:
        survivor, failed = _slotted("10", 0, "running"), _slotted("11", 1, "failed", exc)
        sched = Sched([survivor, failed])
        gang_failed(sched, failed)
        assert sched.lines == [f"gang train: {said}; stopping the other 1 node(s)"] and sched.stops == [("10", why)]
        assert crash_note(-15, why) == f"Task failed: its process was killed by signal SIGTERM because {why}.\n"
        survivor.state = "killed"
        gang_failed(sched, survivor)
        assert sched.after == ["11"], "the gang is retried or fails on its first failure"
        assert sched.lines[-1].startswith("gang train stopped ") and sched.lines[-1].endswith(why.split("gang ")[1])


def test_when_the_engine_ends_the_job_first_a_node_silent_by_then_is_named_first(tmp_path):
    """Slurm's NODE_FAIL came before the heartbeat timeout: the silent node's attempt is dated by its last beat, so
    the scheduler, which takes the gang's earliest failure, names it and not the survivor."""
    from stoker.runtime.contract import EXITED, JobStatus
    from stoker.runtime.driver.lostnodes import watch_gang
    from stoker.store.blobs import open_store
    from stoker.store.manifest import manifest_outcome

    store = open_store(str(tmp_path / "store"))
    ref, tasks = _gang()
    for i, t in enumerate(tasks):
        t.parallel = GangSlot.gang(2, "10")[i]
        _beat(store, t, i, 1, 100.0)

    class S:
        def __init__(self) -> None:
            self.store, self.flow, self.run_id = store, "F", "R"
            self.watch = NodeWatch(store, "F", "R", timeout=60.0)  # longer than Slurm took

        def _spec(self, t):
            return TaskSpec(flow="F", run_id="R", step=t.step, task_id=t.task_id, store_url=str(store.url),
                            parallel=t.parallel)

    ended = JobStatus(EXITED, exit_code=-15, reason="a node failed")
    name = manifest_name("F", "R", "train", "11", 0)
    sched = S()
    watch_gang(sched, ref, tasks, JobStatus("running"), 1000.0)
    _beat(store, tasks[0], 0, 2, 104.0, state="ended", code=1)
    watch_gang(sched, ref, tasks, ended, 1006.0)
    assert not store.exists(name), "silent for 6 s: it may have been killed (out of memory): no guess"
    sched = S()
    _beat(store, tasks[0], 0, 1, 100.0)
    watch_gang(sched, ref, tasks, JobStatus("running"), 1000.0)
    _beat(store, tasks[0], 0, 2, 104.0, state="ended", code=1)
    watch_gang(sched, ref, tasks, ended, 1012.0)
    m, _ = manifest_outcome(store, name)
    assert m["exception"]["type"] == "NodeLost" and m["finished_at"] == 100.0
    assert m["exception"]["message"].startswith("node 1 (host n2) lost: no heartbeat for 12 s")


def test_the_gang_line_shows_the_lost_node():
    from stoker.runtime.contract import RUNNING, JobRef, JobStatus
    from stoker.runtime.driver.gangview import GangView, node_states
    from stoker.runtime.driver.queue import Task as SchedTask

    ref = JobRef(backend="slurm", job_id="7", members=2, kind="gang")
    tasks = [SchedTask(step="train", task_id=str(i), inputs=[], foreach=[], max_attempts=1, gang="g", job=ref,
                       member=i) for i in range(2)]
    tasks[0].state, tasks[1].state = "killed", "failed"
    tasks[1].manifest = {"exception": {"type": "NodeLost", "message": "node 1 (host n2) lost: no heartbeat for 6 s"}}
    states = node_states(tasks, ref, JobStatus(RUNNING))
    assert states == ["killed", "lost"]
    assert GangView().line("j", "r/train", states) == "[r/train] gang of 2 nodes: node 0 killed, node 1 lost"


def test_a_node_silent_after_every_other_one_ended_well_is_left_to_the_engine():
    """It may be saving large artifacts with the GIL held (its beat thread starved): not a loss by itself."""
    store, (ref, tasks) = Store(), _gang()
    w = _watch(store)
    _beat(store, tasks[0], 0, 1, 100.0)
    _beat(store, tasks[1], 1, 1, 100.0)
    assert w.lost(ref, tasks, 1000.0) is None
    _beat(store, tasks[1], 1, 2, 101.0, state="ended", code=0)
    assert w.lost(ref, tasks, 1030.0) is None
    _beat(store, tasks[1], 1, 3, 102.0, state="ended", code=1)  # had it failed, the silence would be a loss
    assert w.lost(ref, tasks, 1031.0) is not None
