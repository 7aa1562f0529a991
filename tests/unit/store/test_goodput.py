"""The goodput ledger (stoker.client.goodput) on synthetic records: manifests, job records and trainer snapshots
written to a store as the runtime and the trainer write them, with hand-computed answers."""

from __future__ import annotations

import gzip
import json

import pytest

from stoker.client.goodput import CATEGORIES, JOBS, run_goodput
from stoker.store.blobs import LocalBlobStore
from stoker.store.checkpoint_advice import advice_line, daly
from stoker.store.goodput import ledger_prefix, take_timings, timed
from stoker.store.manifest import Manifest, read_manifest, run_prefix, write_manifest


@pytest.fixture
def store(tmp_path) -> LocalBlobStore:
    return LocalBlobStore(tmp_path / "store")


def manifest(store, task: str, attempt: int, started: float, finished: float, status: str = "ok",
             timings: dict | None = None, node: int | None = None, step: str = "train") -> None:
    m = Manifest(flow="F", run_id="1", step=step, task_id=task, attempt=attempt, status=status, started_at=started,
                 finished_at=finished, artifacts={}, timings=timings,
                 parallel={"node_index": node, "num_nodes": 2} if node is not None else None)
    write_manifest(store, m)


def snapshots(store, task: str, attempt: int, *snaps: dict) -> None:
    """Ledger snapshots as the trainer's series writer stores them (a gzip chunk of JSON lines)."""
    lines = "".join(json.dumps({"kind": "ledger", "version": 1, **s}) + "\n" for s in snaps)
    store.write(ledger_prefix("F", "1", "train", task, attempt) + "000001.jsonl.gz", gzip.compress(lines.encode()))


def snap(created: float, time_: float, *, start: int, step: int, final: bool, committed: int | None = None,
         proc: float | None = None, **seconds: float) -> dict:
    secs = {"init": 0.0, "checkpoint_load": 0.0, "steps": 0.0, "checkpoint_save": 0.0, "eval": 0.0, **seconds}
    assert abs(sum(secs.values()) - (time_ - created)) < 1e-9, "a snapshot's activities partition its time"
    return {"time": time_, "created_at": created, "process_started_at": proc, "final": final, "seconds": secs,
            "start_step": start, "step": step, "committed_step": committed, "tokens_per_step": 128, "saves": 2,
            "checkpoint_every": 20, "node": 0}


def only_task(doc: dict) -> dict:
    (step,) = doc["steps"]
    (task,) = step["tasks"]
    return task


def assert_sums(doc: dict) -> None:
    for step in doc["steps"]:
        for task in step["tasks"]:
            assert sum(task["seconds"].values()) == pytest.approx(task["wall_s"])
            for a in task["attempts"]:
                assert sum(a["seconds"].values()) == pytest.approx(a["wall_s"])
        assert sum(step["seconds"].values()) == pytest.approx(step["node_seconds"])
    assert sum(doc["total"]["seconds"].values()) == pytest.approx(doc["total"]["node_seconds"])


def test_a_killed_attempt_and_its_retry(store):
    """Attempt 0 is killed at 1100 (its last snapshot at 1080, step 60, committed 40); attempt 1 resumes from 40."""
    manifest(store, "2", 0, 1000, 1100, "failed", timings={"preflight": 2.0})
    snapshots(store, "2", 0, snap(1010, 1020, start=0, step=0, final=False, proc=1005, init=5, steps=5),
              snap(1010, 1080, start=0, step=60, final=False, committed=40, proc=1005, init=5, steps=60,
                   checkpoint_save=5))
    manifest(store, "2", 1, 1110, 1200, "ok")
    snapshots(store, "2", 1, snap(1115, 1195, start=40, step=110, final=True, committed=110, proc=1112, init=5,
                                  checkpoint_load=3, steps=70, checkpoint_save=2))
    manifest(store, "1", 0, 990, 995, step="start")  # not a training step: no ledger, not in it
    doc = run_goodput(store, "F", "1")
    assert_sums(doc)
    task = only_task(doc)
    a0, a1 = task["attempts"]
    assert a0["seconds"] == {**dict.fromkeys(CATEGORIES, 0.0), "startup": 15, "checkpoint_save": 5, "productive": 40,
                             "lost": 40}
    assert a0["startup"] == {"preflight": 2, "imports": 5, "launch": 3, "trainer_init": 5}
    assert a0["steps"] == {"first": 0, "last": 60, "mean_step_s": 1.0, "kept": 40, "lost": 20}
    assert a1["seconds"] == {**dict.fromkeys(CATEGORIES, 0.0), "retry_wait": 10, "startup": 10, "checkpoint_load": 3,
                             "productive": 70, "checkpoint_save": 2, "shutdown": 5}
    assert task["wall_s"] == 200
    step = doc["steps"][0]
    assert step["goodput"] == pytest.approx(110 / 190) and step["ettr"] == pytest.approx(110 / 200)
    assert step["tokens"] == 110 * 128 and step["tokens_per_s"] == pytest.approx(110 * 128 / 200)
    assert step["failures"] == 1 and step["mtbf_s"] == pytest.approx(190)
    advice = step["checkpoint"].pop("advice")
    assert step["checkpoint"] == {"saves": 4, "every_steps": 20, "blocking_s": 7, "mean_blocking_s": 7 / 4}
    # Daly from the measured save (1.75 s), the mean step (130 s / 130 steps) and the MTBF observed (190 s / 1)
    assert advice["mtbf_s"] == 190 and advice["mtbf_source"] == "observed" and advice["failures"] == 1
    assert advice["save_s"] == 1.75 and advice["mean_step_s"] == 1.0
    assert advice["daly_s"] == pytest.approx(24.6341, abs=1e-4) and advice["every_steps"] == 25
    assert step["cost"] is None and doc["total"]["cost"] is None and not doc["notes"]
    assert json.loads(json.dumps(doc)) == doc


def test_steps_checkpointed_after_the_last_snapshot_are_kept(store):
    """Killed 20 s after its last snapshot (step 60) while the next attempt resumed from step 70: the 10 steps
    after the snapshot were kept (productive at the mean step time), the other 10 s of the tail lost."""
    manifest(store, "2", 0, 1000, 1100, "failed")
    snapshots(store, "2", 0, snap(1000, 1080, start=0, step=60, final=False, committed=60, steps=80))
    manifest(store, "2", 1, 1100, 1150, "ok")
    snapshots(store, "2", 1, snap(1100, 1150, start=70, step=100, final=True, steps=50))
    a0 = only_task(run_goodput(store, "F", "1"))["attempts"][0]
    mean = 80 / 60
    assert a0["seconds"]["productive"] == pytest.approx(80 + 10 * mean)
    assert a0["seconds"]["lost"] == pytest.approx(20 - 10 * mean)
    assert a0["steps"]["kept"] == 70


def test_an_attempt_that_never_trained_is_start_up(store):
    manifest(store, "2", 0, 1000, 1030, "failed", timings={"stage": 12.0, "neuron_cache_upload": 3.0})
    manifest(store, "2", 1, 1040, 1100, "ok")
    snapshots(store, "2", 1, snap(1050, 1100, start=0, step=10, final=True, steps=50))
    task = only_task(run_goodput(store, "F", "1"))
    a0 = task["attempts"][0]
    assert a0["seconds"]["startup"] == 27 and a0["seconds"]["shutdown"] == 3
    assert a0["startup"] == {"stage": 12, "launch": 15}
    assert task["attempts"][1]["seconds"]["retry_wait"] == 10
    assert sum(task["seconds"].values()) == pytest.approx(100)


def test_a_batch_gang_with_queue_start_up_and_cost(store):
    """Two nodes of one Batch job: submitted at 900, started by Batch at 950; each node's agent timed its set-up and
    code package; priced by the backend's table (here a callable)."""
    ref = {"backend": "batch", "job_id": "j1", "members": 2, "kind": "gang", "step": "train", "task_ids": ["2", "3"],
           "attempt": 0, "submitted_at": 900.0, "extra": {"started_at": 950.0, "instance_type": "trn1.32xlarge"}}
    store.write(run_prefix("F", "1") + JOBS + "batch-j1.json", json.dumps(ref).encode())
    for node, task in enumerate(("2", "3")):
        manifest(store, task, 0, 1000, 1100, timings={"node_setup": 1.0, "code_package": 4.0}, node=node)
        snapshots(store, task, 0, snap(1010, 1090, start=0, step=80, final=True, steps=80))
    doc = run_goodput(store, "F", "1", price=lambda itype: 20.0 if itype == "trn1.32xlarge" else None)
    assert_sums(doc)
    step = doc["steps"][0]
    assert [t["node"] for t in step["tasks"]] == [0, 1]
    a = step["tasks"][0]["attempts"][0]
    assert a["seconds"]["queue"] == 50 and a["seconds"]["startup"] == 45 + 5 + 10
    assert a["startup"] == {"environment": 45, "node_setup": 1, "code_package": 4, "launch": 10}
    assert step["node_seconds"] == 400 and step["wall_s"] == 200 and step["seconds"]["productive"] == 160
    assert step["goodput"] == pytest.approx(160 / 300)
    assert step["tokens"] == 80 * 128, "a gang's steps are counted once"
    assert step["cost"]["paid_usd"] == pytest.approx(300 * 20 / 3600)
    assert step["cost"]["not_productive_usd"] == pytest.approx(140 * 20 / 3600)
    assert step["cost"]["lost_usd"] == 0 and doc["total"]["cost"]["prices"] == {"trn1.32xlarge": 20.0}


def test_a_running_attempt_counts_to_now(store):
    snapshots(store, "2", 0, snap(1000, 1050, start=0, step=50, final=False, proc=990, steps=50))
    task = only_task(run_goodput(store, "F", "1", now=1060))
    a = task["attempts"][0]
    assert a["status"] == "running" and a["wall_s"] == 70
    assert a["seconds"]["productive"] == 60 and a["seconds"]["startup"] == 10


def test_straggler_idle_comes_out_of_the_productive_time(store):
    manifest(store, "2", 0, 1000, 1100)
    snapshots(store, "2", 0, {**snap(1000, 1100, start=0, step=100, final=True, steps=100), "straggler_idle_s": 12.5})
    sec = only_task(run_goodput(store, "F", "1"))["seconds"]
    assert sec["productive"] == 87.5 and sec["straggler_idle"] == 12.5


def test_clock_skew_is_said_in_the_notes_never_a_negative_category(store):
    """A retry whose record starts before its predecessor ended (clocks of two hosts): the sum still holds, no
    category is negative (the 10 s counted twice come out of the retry's own time: here its steps), and the notes say
    so when it is over 1 %."""
    manifest(store, "2", 0, 1000, 1100, "failed")
    snapshots(store, "2", 0, snap(1000, 1100, start=0, step=100, final=True, committed=100, steps=100))
    manifest(store, "2", 1, 1090, 1200)
    snapshots(store, "2", 1, snap(1090, 1200, start=100, step=200, final=True, steps=110))
    doc = run_goodput(store, "F", "1")
    assert_sums(doc)
    assert min(doc["total"]["seconds"].values()) >= 0 and doc["total"]["seconds"]["other"] == 0
    assert doc["total"]["seconds"]["productive"] == 200 and doc["total"]["node_seconds"] == 200
    assert only_task(doc)["attempts"][1]["overlap_s"] == 10
    assert any("10.0 s (5.0 %) of the node-time is counted twice" in n for n in doc["notes"]), doc["notes"]


def test_the_jobs_folder_is_the_schedulers():
    from stoker.runtime.driver.jobs import jobs_prefix

    assert jobs_prefix("F", "1") == run_prefix("F", "1") + JOBS


def test_phase_timings_are_taken_once():
    take_timings()
    with timed("stage"):
        pass
    with pytest.raises(RuntimeError), timed("stage"):
        raise RuntimeError("a failed phase took its time too")
    got = take_timings()
    assert set(got) == {"stage"} and got["stage"] >= 0
    assert take_timings() is None


def test_work_kept_is_where_the_next_attempt_that_trained_resumed(store):
    """Attempt 1 died in its start-up; attempt 2 resumed from step 40: that is what attempt 0 kept."""
    manifest(store, "2", 0, 1000, 1100, "failed")
    snapshots(store, "2", 0, snap(1000, 1100, start=0, step=60, final=True, committed=20, steps=100))
    manifest(store, "2", 1, 1100, 1110, "failed")
    manifest(store, "2", 2, 1110, 1200, "ok")
    snapshots(store, "2", 2, snap(1110, 1200, start=40, step=100, final=True, steps=90))
    a0 = only_task(run_goodput(store, "F", "1"))["attempts"][0]
    assert a0["steps"]["kept"] == 40 and a0["seconds"]["lost"] == pytest.approx(100 * 20 / 60)


def test_the_commands_text(store):
    from stoker.cli.goodput import ledger_lines, summary, summary_lines

    manifest(store, "2", 0, 1000, 1100, "failed", timings={"preflight": 2.0})
    snapshots(store, "2", 0, snap(1010, 1080, start=0, step=60, final=False, committed=40, proc=1005, init=5,
                                  steps=65))
    manifest(store, "2", 1, 1110, 1200, "ok")
    snapshots(store, "2", 1, snap(1115, 1195, start=40, step=110, final=True, steps=80))
    doc = run_goodput(store, "F", "1")
    text = "\n".join(ledger_lines(doc))
    assert "goodput: 64.9% of 3m10s paid node-time" in text and "lost work" in text
    assert "attempt 0 (failed, 1m40s)" in text and "20 recomputed (kept to 40)" in text
    assert "preflight 2.0s" in text
    short = summary_lines(summary(doc), "F/1")
    assert short[0].startswith("goodput: 64.9%") and short[-1].endswith("stoker goodput F/1")
    assert summary_lines({"error": "no store"}) == ["goodput: not available (no store)"]
    assert summary({**doc, "steps": []}) is None and summary_lines(None) == []


def test_the_checkpoint_advice_in_show_and_goodput(store, monkeypatch):
    """The advice line on the killed-and-retried fixture: the interval from the save time measured (1.75 s blocking),
    the mean step (1 s) and the MTBF observed (190 s of paid time, 1 failure); a given MTBF overrides the observed
    one; a deterministic failure is no failure rate; a run without failures assumes 24 h per node."""
    from stoker.cli.goodput import ledger_lines, summary, summary_lines

    monkeypatch.delenv("STOKER_MTBF_HOURS", raising=False)
    manifest(store, "2", 0, 1000, 1100, "failed", timings={"preflight": 2.0})
    snapshots(store, "2", 0, snap(1010, 1020, start=0, step=0, final=False, proc=1005, init=5, steps=5),
              snap(1010, 1080, start=0, step=60, final=False, committed=40, proc=1005, init=5, steps=60,
                   checkpoint_save=5))
    manifest(store, "2", 1, 1110, 1200, "ok")
    snapshots(store, "2", 1, snap(1115, 1195, start=40, step=110, final=True, committed=110, proc=1112, init=5,
                                  checkpoint_load=3, steps=70, checkpoint_save=2))
    line = ("checkpoint every 20 steps (20 s); advised every 25 steps (25 s; Daly, save 1.8 s blocking, MTBF 3.2 min "
            "observed from 1 failure); expected loss 13.6 % vs 13.8 % now")
    doc = run_goodput(store, "F", "1")
    assert f"    {line}" in ledger_lines(doc)
    assert sum(x.endswith(line) for x in ledger_lines(doc)) == 1, "`stoker goodput` says it once, under the step"
    assert f"  step train: {line}" in summary_lines(summary(doc), "F/1")
    assert summary(doc)["steps"][0]["checkpoint"]["advice"]["every_steps"] == 25

    given = run_goodput(store, "F", "1", mtbf_hours=2.0)["steps"][0]["checkpoint"]["advice"]
    assert given["mtbf_s"] == 7200 and given["mtbf_note"] == "given ($STOKER_MTBF_HOURS=2 h)"
    assert given["every_steps"] == round(daly(1.75, 7200)) == 158
    monkeypatch.setenv("STOKER_MTBF_HOURS", "2")
    assert run_goodput(store, "F", "1")["steps"][0]["checkpoint"]["advice"] == given

    monkeypatch.delenv("STOKER_MTBF_HOURS")
    m = read_manifest(store, "F", "1", "train", "2", 0)
    m["exception"] = {"type": "ConfigError", "cause": "config", "evidence": "ConfigError: bad"}
    store.write(next(n for n in store.list(run_prefix("F", "1")) if n.endswith("/2/0/manifest.json")),
                json.dumps(m).encode())  # unsigned now: its times are still read, said in the notes
    doc = run_goodput(store, "F", "1")
    advice = doc["steps"][0]["checkpoint"]["advice"]
    assert advice["mtbf_source"] == "assumed" and advice["mtbf_note"] == "assumed (24 h per node)"
    assert advice["failures"] == 0 and advice["every_steps"] == round(daly(1.75, 24 * 3600)) == 549
    assert "step train: checkpoint every 20 steps (20 s); advised every 549 steps (9.2 min;" in "\n".join(
        summary_lines(summary(doc)))


def test_no_save_no_advice(store):
    from stoker.cli.goodput import ledger_lines

    manifest(store, "2", 0, 1000, 1100)
    snapshots(store, "2", 0, {**snap(1000, 1100, start=0, step=100, final=True, steps=100), "saves": 0})
    doc = run_goodput(store, "F", "1")
    assert doc["steps"][0]["checkpoint"]["advice"] is None
    assert any("no checkpoint was saved" in line for line in ledger_lines(doc))


def test_the_trainers_mtbf_is_the_advices_when_none_was_observed(store, monkeypatch):
    monkeypatch.delenv("STOKER_MTBF_HOURS", raising=False)
    manifest(store, "2", 0, 1000, 1100, node=0)
    manifest(store, "3", 0, 1000, 1100, node=1)
    policy = {"auto": True, "mtbf_hours": 6.0, "mtbf_source": "setting"}
    for task in ("2", "3"):
        snapshots(store, task, 0, {**snap(1000, 1100, start=0, step=100, final=True, steps=96, checkpoint_save=4),
                                   "checkpoint_policy": policy, "checkpoint_every": 50})
    advice = run_goodput(store, "F", "1")["steps"][0]["checkpoint"]["advice"]
    assert advice["mtbf_s"] == 3 * 3600
    assert advice["mtbf_note"] == "given (checkpoint.mtbf_hours=6 h per node / 2 nodes)"
    assert advice["auto"] and advice["save_s"] == 2 and advice["mean_step_s"] == pytest.approx(0.96)
    assert advice_line(advice, auto=True).startswith("checkpoint every 50 steps (48 s, chosen by every=auto); advised")
