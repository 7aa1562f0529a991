"""Node-hours and estimated cost of a run: job records and manifests written to a local store as the scheduler and
the backends write them, read back by `run_cost`, `stoker show` and the pipeline's summary line."""

from __future__ import annotations

import pytest

from stoker.backends.aws.cost import cost_headline, run_cost
from stoker.errors import ConfigError
from stoker.runtime.contract import JobRef
from stoker.runtime.driver.jobs import job_record_name
from stoker.store import MetadataDB, open_store
from stoker.store.blobs import LocalBlobStore
from stoker.store.manifest import write_manifest
from stoker.store.paths import current_user, default_db_path

T0 = 1_700_000_000.0
FLOW, RUN = "Pretrain", "7"


class Recorder:
    """Writes what a run leaves in the store: task manifests and job records (the scheduler's JobRefs)."""

    def __init__(self, store: LocalBlobStore, db: MetadataDB | None = None) -> None:
        self.store, self.db = store, db

    def task(self, step: str, task_id: str, start: float, seconds: float, attempt: int = 0, **extra) -> dict:
        m = {"flow": FLOW, "run_id": RUN, "step": step, "task_id": task_id, "attempt": attempt, "status": "ok",
             "started_at": T0 + start, "finished_at": T0 + start + seconds, "artifacts": {}, **extra}
        write_manifest(self.store, m)
        if self.db is not None:
            self.db.ingest_manifest(m)
        return m

    def job(self, backend: str, job_id: str, step: str, task_ids: list[str], attempt: int = 0, **extra) -> JobRef:
        ref = JobRef(backend=backend, job_id=job_id, members=len(task_ids), kind="gang" if len(task_ids) > 1 else
                     "task", step=step, task_ids=task_ids, attempt=attempt, submitted_at=T0, extra=extra)
        self.store.write(job_record_name(FLOW, RUN, ref), ref.to_json().encode())
        return ref


@pytest.fixture
def rec(tmp_path) -> Recorder:
    return Recorder(LocalBlobStore(tmp_path / "store"))


def gang(rec: Recorder, n: int = 4, seconds: float = 1700.0, attempt: int = 0) -> list[str]:
    ids = [str(10 + i) for i in range(n)]
    for t in ids:
        rec.task("train", t, 100.0, seconds, attempt=attempt, parallel={"node_index": int(t) - 10, "num_nodes": n})
    return ids


def test_a_4_node_trn1_job_for_30_minutes(rec):
    rec.task("start", "1", 0.0, 60.0)
    ids = gang(rec)
    rec.job("batch", "job-a", "train", ids, instance_type="trn1.32xlarge", started_at=T0 + 50, stopped_at=T0 + 1850)
    rec.task("end", "20", 2000.0, 60.0)
    s = run_cost(rec.store, FLOW, RUN)
    train = next(r for r in s.rows if r.step == "train")
    assert (train.backend, train.instance_type, train.nodes, train.jobs) == ("batch", "trn1.32xlarge", 4, 1)
    assert train.node_hours == pytest.approx(2.0) and train.price == 21.50 and train.cost == pytest.approx(43.00)
    local = next(r for r in s.rows if r.backend == "local")
    assert local.step == "end, start" and local.node_hours == pytest.approx(120 / 3600)
    assert s.cost == pytest.approx(43.00) and s.node_hours == pytest.approx(2.0 + 120 / 3600)
    assert s.worth_showing and s.notes == []
    assert s.headline() == "2.03 node-hours, estimated $43.00 (on-demand prices)"
    lines = s.lines()
    assert lines[0] == "cost: 2.03 node-hours, estimated $43.00 (on-demand prices)"
    assert "train" in lines[1] and "batch  4 x trn1.32xlarge: 2.00 node-hours x $21.50/h = $43.00" in lines[1]
    assert s.to_dict()["cost_usd"] == 43.00 and s.to_dict()["steps"][0]["cost"] == pytest.approx(43.0)


def test_prices_can_be_overridden(rec, tmp_path, monkeypatch):
    prices = tmp_path / "prices.toml"
    prices.write_text('"trn1.32xlarge" = 12.5\n"x9.huge" = 2.0\n')
    monkeypatch.setenv("STOKER_PRICES", str(prices))
    ids = gang(rec)
    rec.job("batch", "job-a", "train", ids, instance_type="trn1.32xlarge", started_at=T0, stopped_at=T0 + 1800)
    rec.job("batch", "job-b", "eval", ["30"], instance_type="x9.huge", started_at=T0, stopped_at=T0 + 3600)
    s = run_cost(rec.store, FLOW, RUN)
    assert {r.step: r.cost for r in s.rows} == {"train": pytest.approx(25.0), "eval": pytest.approx(2.0)}


def test_unknown_types_and_missing_instance_types_say_why(rec):
    rec.job("batch", "job-a", "train", gang(rec), instance_type="trn2.48xlarge", started_at=T0,
            stopped_at=T0 + 3600)  # known, but no list price in the table
    rec.job("batch", "job-b", "eval", ["30"], instance_type="x9.huge", started_at=T0, stopped_at=T0 + 3600)
    rec.job("batch", "job-c", "export", ["40"], instance_type=None, started_at=T0, stopped_at=T0 + 1800)
    s = run_cost(rec.store, FLOW, RUN)
    assert s.cost is None and s.node_hours == pytest.approx(4.0 + 1.0 + 0.5)
    assert s.headline() == "5.50 node-hours, cost not estimated (no price for the instance types used)"
    assert "no price for trn2.48xlarge: add it to $STOKER_PRICES" in s.notes[0]
    assert "no price for x9.huge" in s.notes[1]
    assert "step export: the Batch job did not record its instance type" in s.notes[2]
    assert "set @batch(instance_type=...)" in s.notes[2]


def test_some_priced_some_not(rec):
    rec.job("batch", "job-a", "train", gang(rec, 2), instance_type="trn1.32xlarge", started_at=T0,
            stopped_at=T0 + 3600)
    rec.job("batch", "job-b", "eval", ["30"], instance_type="x9.huge", started_at=T0, stopped_at=T0 + 1800)
    assert run_cost(rec.store, FLOW, RUN).headline() == \
        "2.50 node-hours, estimated $43.00 (on-demand prices; without 0.50 unpriced node-hours)"


def test_without_batch_times_the_manifests_count(rec):
    ids = gang(rec, 2, seconds=900.0)  # each node's task ran 15 minutes
    rec.job("batch", "job-a", "train", ids, instance_type="g5.48xlarge")
    s = run_cost(rec.store, FLOW, RUN)
    assert s.rows[0].node_hours == pytest.approx(0.5) and s.cost == pytest.approx(0.5 * 16.288)


def test_retries_add_up(rec):
    first = gang(rec, 4, seconds=600.0, attempt=0)
    rec.job("batch", "job-a", "train", first, instance_type="trn1.32xlarge", started_at=T0, stopped_at=T0 + 900)
    second = gang(rec, 4, seconds=1200.0, attempt=1)
    rec.job("batch", "job-b", "train", second, attempt=1, instance_type="trn1.32xlarge", started_at=T0 + 1000,
            stopped_at=T0 + 2800)
    s = run_cost(rec.store, FLOW, RUN)
    (row,) = s.rows
    assert row.jobs == 2 and row.node_hours == pytest.approx(4 * 0.25 + 4 * 0.5)
    assert "2 jobs" in s.lines()[1]


def test_a_running_job_counts_its_time_so_far(rec):
    rec.job("batch", "job-a", "train", ["10", "11"], instance_type="trn1.32xlarge", started_at=T0)
    rec.job("batch", "job-b", "train", ["12"], attempt=0, instance_type="trn1.32xlarge")  # not started
    s = run_cost(rec.store, FLOW, RUN, now=T0 + 1800)
    assert s.rows[0].node_hours == pytest.approx(1.0) and s.rows[0].running
    assert "(still running)" in s.lines()[1]
    assert any("job-b have no start time yet" in n for n in s.notes)


def test_slurm_and_local_are_counted_not_priced(rec):
    rec.task("start", "1", 0.0, 120.0)
    rec.task("prep", "2", 60.0, 120.0)  # overlaps start: one machine busy for 180 s, not 240
    ids = gang(rec, 2, seconds=1800.0)
    rec.job("slurm", "4242", "train", ids)
    s = run_cost(rec.store, FLOW, RUN)
    slurm = next(r for r in s.rows if r.backend == "slurm")
    assert slurm.node_hours == pytest.approx(1.0) and slurm.cost is None and slurm.instance_type is None
    local = next(r for r in s.rows if r.backend == "local")
    assert local.node_hours == pytest.approx(180 / 3600) and local.jobs == 2
    assert s.cost is None and s.headline() == "1.05 node-hours (local, slurm: cost not estimated)"
    assert s.notes == ["slurm steps are not priced (a cluster's own cost has no list price)"]
    assert s.lines()[1:3] == ["  train        slurm  2 nodes: 1.00 node-hours, not priced",
                              "  prep, start  local  this machine, 2 tasks: 0.05 node-hours, not priced"]


def test_a_local_run_has_nothing_to_show_and_resumed_tasks_cost_nothing(rec):
    rec.task("start", "1", 0.0, 36.0)
    rec.task("train", "2", 0.0, 3600.0, origin_task="Pretrain/6/train/2")  # cloned by resume
    s = run_cost(rec.store, FLOW, RUN)
    assert [r.backend for r in s.rows] == ["local"] and s.node_hours == pytest.approx(0.01)
    assert not s.worth_showing and s.headline() == "0.01 node-hours (local: cost not estimated)"
    assert run_cost(rec.store, FLOW, "nope").headline() == "0.00 node-hours (local: cost not estimated)"


def test_the_pipeline_summary_line(rec, tmp_path):
    rec.job("batch", "job-a", "train", gang(rec), instance_type="trn1.32xlarge", started_at=T0,
            stopped_at=T0 + 1800)
    assert cost_headline(str(tmp_path / "store"), FLOW, RUN) == "2.00 node-hours, estimated $43.00 (on-demand prices)"
    assert cost_headline("ftp://nowhere", FLOW, RUN).startswith("not available (unsupported store URL")


def test_stoker_show_prints_the_cost(capsys):
    from stoker.cli.main import main

    db = MetadataDB(default_db_path())
    r = Recorder(open_store(), db)
    db.create_run(FLOW, RUN, user=current_user(), tags=(), params={}, created_at=T0)
    r.task("start", "1", 0.0, 60.0)
    ids = gang(r)
    r.job("batch", "job-a", "train", ids, instance_type="trn1.32xlarge", started_at=T0 + 50, stopped_at=T0 + 1850)
    db.set_run_status(FLOW, RUN, "succeeded", finished_at=T0 + 2000)
    db.create_run(FLOW, "8", user=current_user(), tags=(), params={}, created_at=T0)
    db.close()

    with pytest.raises(SystemExit) as e:
        main(["show", f"{FLOW}/{RUN}"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "cost: 2.02 node-hours, estimated $43.00 (on-demand prices)" in out
    assert "batch  4 x trn1.32xlarge: 2.00 node-hours x $21.50/h = $43.00" in out
    with pytest.raises(SystemExit):
        main(["show", f"{FLOW}/8"])
    assert "cost" not in capsys.readouterr().out  # nothing ran off this machine: nothing to say


def test_registered_memory_is_an_estimate_a_user_can_override(tmp_path, monkeypatch):
    """AWS publishes no per-type figure of ECS-registered memory: stoker's are estimates, below what a job can
    ask, and `[ecs_memory_mib]` of $STOKER_PRICES replaces them with a measured one (describe-container-instances)."""
    from stoker.backends.aws.instances import instance_type
    from stoker.backends.aws.render import whole_node

    monkeypatch.delenv("STOKER_PRICES", raising=False)
    trn = instance_type("trn1.32xlarge")
    assert trn.ecs_memory_mib == 507_821 < 512 * 1024
    assert 480_000 < trn.ecs_memory_mib  # examples/aws/llama2_trainium.py asks for memory=480000
    assert instance_type("p5.48xlarge").ecs_memory_mib == int(2048 * 1024 * 0.968)
    prices = tmp_path / "overrides.toml"
    prices.write_text('"trn1.32xlarge" = 12.5\n\n[ecs_memory_mib]\n"trn1.32xlarge" = 500000\n')
    monkeypatch.setenv("STOKER_PRICES", str(prices))
    trn = instance_type("trn1.32xlarge")
    assert (trn.ecs_memory_mib, trn.price) == (500_000, 12.5)
    assert whole_node({"gpu": 0, "trainium": 16, "inferentia": 0, "efa": 8}, ["trn1.32xlarge"])["memory"] == 500_000
    bad = tmp_path / "bad.toml"
    bad.write_text('[ecs_memory_mib]\n"trn1.32xlarge" = -1\n')
    monkeypatch.setenv("STOKER_PRICES", str(bad))
    with pytest.raises(ConfigError, match=r"STOKER_PRICES .*bad.toml: .*Fix: .*\[ecs_memory_mib\]"):
        instance_type("trn1.32xlarge")
