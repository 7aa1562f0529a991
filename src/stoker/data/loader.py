"""``BlockLoader``: an infinite, deterministic, data-parallel batch iterator with exact resume.

Epoch ``e`` visits the blocks in the order ``default_rng([seed, e]).permutation(n)`` (or in order when
``shuffle=False``). Global step ``s`` of an epoch takes the ``batch_size * dp_size`` blocks starting at
``s * batch_size * dp_size`` of that order and rank ``r`` gets its ``r``-th slice, so ranks never overlap
and every rank sees the same number of batches. Blocks left over at the end of an epoch (fewer than one
``global_batch``, the blocks of one optimizer step, by default ``batch_size * dp_size``) are skipped that
epoch; a new permutation follows.

The data order depends only on the seed, the dataset and ``global_batch``: a run resumed with another
data-parallel size (and gradient accumulation making up the same global batch) continues with exactly
the blocks the first run would have used next, split differently over the ranks.
"""

from __future__ import annotations

import numpy as np

from stoker.errors import DataError


class BlockLoader:
    """Yields ``np.int64`` arrays ``[batch_size, block_size]`` forever; ``state_dict()`` resumes exactly."""

    def __init__(self, dataset, batch_size: int, dp_rank: int = 0, dp_size: int = 1, seed: int = 0,
                 shuffle: bool = True, global_batch: int | None = None) -> None:
        if batch_size < 1:
            raise DataError(f"batch_size={batch_size}: must be >= 1")
        if not 0 <= dp_rank < dp_size:
            raise DataError(f"dp_rank={dp_rank} must be in [0, dp_size={dp_size})")
        self.dataset, self.batch_size, self.dp_rank, self.dp_size = dataset, batch_size, dp_rank, dp_size
        self.seed, self.shuffle = int(seed), bool(shuffle)
        self.num_blocks = len(dataset)
        self.step_blocks = batch_size * dp_size  # blocks of one step of this loader (all ranks)
        self.global_batch = int(global_batch or self.step_blocks)
        if self.global_batch % self.step_blocks:
            raise DataError(f"global_batch={self.global_batch} is not a multiple of batch_size x dp_size = "
                            f"{self.step_blocks}")
        self.steps_per_epoch = self.num_blocks // self.global_batch * (self.global_batch // self.step_blocks)
        if self.steps_per_epoch == 0:
            raise DataError(f"the dataset has {self.num_blocks} blocks, fewer than one global batch "
                            f"({self.global_batch}: batch_size {batch_size} x dp_size {dp_size} x accumulation); "
                            "use a smaller batch size or block size, or a larger corpus")
        self.epoch = 0
        self.step = 0  # next step within the epoch
        self._order: np.ndarray | None = None
        self._order_epoch = -1

    def _epoch_order(self) -> np.ndarray:
        if self._order_epoch != self.epoch:
            if self.shuffle:
                self._order = np.random.default_rng([self.seed, self.epoch]).permutation(self.num_blocks)
            else:
                self._order = np.arange(self.num_blocks)
            self._order_epoch = self.epoch
        return self._order

    def indices(self) -> np.ndarray:
        """The block indices of this rank's next batch (does not advance)."""
        start = self.step * self.step_blocks + self.dp_rank * self.batch_size
        return self._epoch_order()[start:start + self.batch_size]

    def __iter__(self) -> BlockLoader:
        return self

    def __next__(self) -> np.ndarray:
        batch = self.dataset.get_batch(self.indices()) if hasattr(self.dataset, "get_batch") else \
            np.stack([np.asarray(self.dataset[int(i)], dtype=np.int64) for i in self.indices()])
        self.step += 1
        if self.step == self.steps_per_epoch:
            self.epoch, self.step = self.epoch + 1, 0
        return batch

    def __len__(self) -> int:
        """Batches per epoch (for every rank)."""
        return self.steps_per_epoch

    def state_dict(self) -> dict:
        """Position and settings; ``load_state_dict`` on a fresh loader continues with the next batch."""
        return {"epoch": self.epoch, "step": self.step, "seed": self.seed, "shuffle": self.shuffle,
                "batch_size": self.batch_size, "dp_size": self.dp_size, "num_blocks": self.num_blocks,
                "global_batch": self.global_batch, "position": self.step * self.step_blocks,
                "samples_seen": (self.epoch * self.steps_per_epoch + self.step) * self.step_blocks}

    def load_state_dict(self, state: dict) -> None:
        """Resume from ``state_dict()`` of any rank, also of a loader with another ``batch_size`` /
        ``dp_size`` as long as the global batch is the same and the position falls on a step of this one."""
        saved_step_blocks = int(state["batch_size"]) * int(state["dp_size"])
        saved = {**state, "global_batch": state.get("global_batch", saved_step_blocks)}
        for key in ("seed", "shuffle", "num_blocks", "global_batch"):
            if saved.get(key) != getattr(self, key):
                raise DataError(f"loader state has {key}={saved.get(key)!r} but this loader has "
                                f"{getattr(self, key)!r}; resume with the same dataset, seed and global batch size "
                                "(or start the data order afresh)")
        position = int(state.get("position", int(state["step"]) * saved_step_blocks))
        if position % self.step_blocks:
            raise DataError(f"the loader stopped {position} blocks into its epoch, not a multiple of this loader's "
                            f"{self.step_blocks} blocks per step (batch_size x dp_size); resume at an optimizer "
                            "step boundary or with a batch_size x dp_size that divides it")
        if not 0 <= position // self.step_blocks < self.steps_per_epoch:
            raise DataError(f"loader state position {position} is outside this epoch of "
                            f"{self.steps_per_epoch * self.step_blocks} blocks")
        self.epoch, self.step = int(state["epoch"]), position // self.step_blocks
