"""The training loop: ``run_training(cfg) -> result`` (also what ``torchrun -m stoker.train`` calls).

One optimizer step = ``accum`` micro-batches per data-parallel rank, so that
``global_batch_size = micro_batch_size x dp x accum`` sequences; then gradients are averaged over the
data-parallel ranks (ZeRO-1) or reduced by FSDP2, clipped by their global norm, and AdamW steps.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import logging
import math
import os
import random
import signal
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from stoker.errors import CheckpointError, ConfigError, DataError, Preempted, TrainingError
from stoker.train.checkpoint import Checkpointer, load_trainer_state, resolve_resume, rng_state, set_rng_state
from stoker.train.config import as_config, resolve_model
from stoker.train.data_source import make_loader, open_training_data
from stoker.train.interval import CheckpointInterval
from stoker.train.ledger import Ledger
from stoker.train.metrics import MetricsWriter, flops_per_token
from stoker.train.model import Llama
from stoker.train.optim import LRSchedule, align_grads, allreduce_grads, build_optimizer, clip_grad_norm
from stoker.train.optim_state import flat_state, set_step
from stoker.train.parallel import ParallelDims, loss_context, parallelize, uses_fsdp, uses_loss_parallel
from stoker.train.settings import TrainConfig
from stoker.train.stragglers import COLLECTIVE, COMPUTE, DATA, NULL_TIMER, StragglerMonitor
from stoker.train.zero import Zero1AdamW, init_adamw_state

log = logging.getLogger(__name__)


class _SigtermFlag:
    """Preemption: SIGTERM only sets a flag; the loop finishes its step, the ranks agree, checkpoint and exit.

    A spot/Batch/Slurm termination (or torchrun forwarding one) sends SIGTERM to every rank, but not at the same
    instant: each rank contributes its flag to an all-reduce (MAX) after every step, so all of them stop after
    the same step and checkpoint it together."""

    def __init__(self) -> None:
        self.hit = False
        self.old: Any = None
        self.installed = threading.current_thread() is threading.main_thread()
        if self.installed:
            self.old = signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, signum: int, frame: Any) -> None:
        self.hit = True

    def agreed(self, device: torch.device) -> bool:
        """True on every rank once any rank has seen SIGTERM (one tiny collective per step)."""
        if not (dist.is_initialized() and dist.get_world_size() > 1):
            return self.hit
        flag = torch.tensor([1 if self.hit else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def restore(self) -> None:
        if self.installed:
            signal.signal(signal.SIGTERM, self.old if self.old is not None else signal.SIG_DFL)


def _accelerator(name: str) -> Any:
    from stoker.train.accelerators import detect

    return detect(name)


class Trainer:
    """Builds data, model, parallelism, optimizer and checkpointer from a :class:`TrainConfig`."""

    step_timer: Any = NULL_TIMER  # fit() sets its straggler monitor's timer (stoker.train.stragglers)

    def __init__(self, cfg: TrainConfig, *, resume_from: str | None = None) -> None:
        try:
            self._build(cfg, resume_from)
        except BaseException:
            self.close()  # a half-built trainer lets its process groups go too
            raise

    def _build(self, cfg: TrainConfig, resume_from: str | None) -> None:
        # long on purpose: device, data, model, parallelism, optimizer, checkpoint in the one order they depend
        # on each other; each step's checks sit next to it
        self.cfg = cfg
        self.ledger = Ledger.from_env()  # where this attempt's time goes (stoker.train.ledger): from here on
        t = cfg.train
        self.acc = _accelerator(t.accelerator)
        self.device = self.acc.set_device()
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        self.dims = ParallelDims(dp=cfg.parallel.dp, tp=cfg.parallel.tp, world_size=self.world_size)
        self.model_cfg = resolve_model(cfg.model)

        # data first: a missing dataset should fail before anything big is built
        block = cfg.data.block_size or self.model_cfg.max_seq_len + 1
        self.dataset = open_training_data(cfg.data.url, split=cfg.data.split, block_size=block,
                                          token_dtype=cfg.data.token_dtype)
        self.seq_len = int(self.dataset.block_size) - 1
        if self.seq_len > self.model_cfg.max_seq_len:
            raise ConfigError(
                f"the data's blocks give sequences of {self.seq_len} tokens but model "
                f"{cfg.model.name or cfg.model.init_from!r} has "
                f"max_seq_len={self.model_cfg.max_seq_len}; prepare the data with block_size <= "
                f"{self.model_cfg.max_seq_len + 1} or set model.max_seq_len"
            )
        data_vocab = getattr(self.dataset, "vocab_size", None)
        if data_vocab is not None and data_vocab > self.model_cfg.vocab_size:
            raise ConfigError(f"the data's tokenizer has {data_vocab} tokens but model.vocab_size is "
                              f"{self.model_cfg.vocab_size}; set model.vocab_size >= {data_vocab}")
        self.dims.validate_model(self.model_cfg, seq_len=self.seq_len, sequence_parallel=cfg.parallel.sequence_parallel)
        per_step = t.micro_batch_size * self.dims.dp
        gbs = t.global_batch_size or per_step
        if gbs % per_step:
            raise ConfigError(f"train.global_batch_size={gbs} is not a multiple of micro_batch_size x dp = "
                              f"{t.micro_batch_size} x {self.dims.dp}; pick a multiple of {per_step}")
        self.global_batch, self.accum = gbs, gbs // per_step
        if cfg.parallel.precision == "bf16" and not self.acc.supports_bf16:
            raise ConfigError(f"parallel.precision=bf16 is not supported on {self.acc.name}; use fp32")

        self.dims.build_mesh(self.acc.device_type)
        self.fsdp = uses_fsdp(self.dims, cfg.parallel)
        self.loss_parallel = uses_loss_parallel(self.dims, cfg.parallel)
        # what a checkpoint needs to be loadable here: the data-parallel size may differ (see optim_state)
        fingerprint = {"model": self.model_cfg.to_dict(), "tp": self.dims.tp,
                       "optimizer_state": "fsdp" if self.fsdp else "flat"}
        layout = {"world": self.world_size, "dp": self.dims.dp, "tp": self.dims.tp, "accum": self.accum,
                  "global_batch": self.global_batch,
                  "dp_mode": cfg.parallel.dp_mode if self.dims.dp_enabled else "none"}
        hints = {"optimizer_state": "FSDP state resumes only under dp_mode=fsdp with 2 or more data-parallel ranks; "
                 "ZeRO-1, DDP and single-rank state resume under each other",
                 "tp": "the tensor-parallel degree must stay; the data-parallel size may change"}
        self.checkpointer = Checkpointer(cfg.checkpoint_dir, keep=cfg.checkpoint.keep,
                                         async_save=cfg.checkpoint.async_save, fingerprint=fingerprint,
                                         config=cfg.to_dict(), layout=layout, hints=hints)
        self.resumed_from = resolve_resume(self.checkpointer, resume_from or cfg.checkpoint.resume_from,
                                           cfg.checkpoint.resume)
        random.seed(t.seed)
        np.random.seed(t.seed)
        torch.manual_seed(t.seed)
        init_from = cfg.model.init_from if not self.resumed_from else ""
        # sharded runs build on the meta device and materialize only each rank's shards (a 70B model
        # never exists whole on one rank); tied embeddings and init_from take the whole-model path
        meta = (self.world_size > 1 and (self.dims.tp_enabled or self.fsdp) and not self.model_cfg.tie_embeddings
                and not init_from)
        with torch.device("meta" if meta else self.device):
            model = Llama(self.model_cfg)
        if not meta:
            model.init_weights(t.seed)
            if init_from:
                load_initial_weights(model, init_from)
        if self.rank == 0:
            _write_run_config(cfg, self.model_cfg)
        self.model = parallelize(model, self.dims, cfg.parallel)
        if meta:
            self.model.to_empty(device=self.device)
            model.init_weights(t.seed, buffer_device=self.device)  # same values as the whole-model path
        self.zero1 = cfg.parallel.dp_mode == "zero1" and self.dims.dp_enabled
        mesh = self.dims.mesh
        self.dp_group = mesh["dp"].get_group() if mesh is not None and self.dims.dp_enabled else None
        self.optimizer = build_optimizer(
            self.model, lr=t.lr, weight_decay=t.weight_decay, betas=(t.beta1, t.beta2), eps=t.eps,
            zero1_group=self.dp_group if self.zero1 else None, dp_rank=self.dims.dp_rank, dp_size=self.dims.dp,
        )
        self.schedule = LRSchedule(self.optimizer, lr=t.lr, min_lr=t.min_lr, warmup=t.warmup_steps,
                                   total=t.steps, schedule=t.schedule)
        self.loader = make_loader(self.dataset, batch_size=t.micro_batch_size, dp_rank=self.dims.dp_rank,
                                  dp_size=self.dims.dp, seed=t.seed, shuffle=cfg.data.shuffle,
                                  global_batch=self.global_batch)
        self.step = 0
        if self.resumed_from:
            with self.ledger.timed("checkpoint_load"):
                self.load(self.resumed_from)
            self.ledger.resumed(self.step)

    def close(self) -> None:
        """Let go of everything that holds a process group, so that ``destroy_process_group`` really destroys them.

        Needed on every exit path before the group is destroyed: ``destroy_process_group`` only drops torch's own
        references, and a ``ProcessGroupGloo`` joins its worker threads only when its last reference goes. Ours
        would outlive the run: the model (FSDP2's state holds the data-parallel group), the optimizer (DTensor
        state), the async checkpoint's group, and the device mesh, whose ``_pg_registry`` holds every group of the
        mesh while DTensor's global sharding-propagation cache keeps the mesh alive for the rest of the process.
        A gloo worker thread still alive at interpreter exit frees its last collective's tensors there, which takes
        the GIL; Python 3.11 ends such a thread (``pthread_exit``) inside that noexcept destructor and the process
        aborts ("terminate called without an active exception", SIGABRT) after a run that succeeded."""
        checkpointer = vars(self).pop("checkpointer", None)
        if checkpointer is not None:
            checkpointer.close()  # waits for a pending async save: its thread uses the groups
        dims = vars(self).get("dims")
        if dims is not None and dims.mesh is not None:
            registry = getattr(dims.mesh, "_pg_registry", None)  # torch >= 2.9: the groups of the mesh, strongly
            if isinstance(registry, dict):
                registry.clear()  # the mesh finds its groups by name outside torch.compile; none are used after this
            dims.mesh = None
        for name in ("model", "optimizer", "schedule", "dp_group", "step_timer"):
            vars(self).pop(name, None)

    # -- checkpoint state -------------------------------------------------------------------------
    def state_dict(self, *, for_load: bool = False, trainer_key: str | None = None) -> dict[str, Any]:
        extra = io.BytesIO()
        if not for_load:
            torch.save({"step": self.step, "schedule": self.schedule.state_dict(), "loader": self.loader.state_dict(),
                        "rng": rng_state()}, extra)
        if self.fsdp:
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
            state = {"model": model_sd, "optim": optim_sd}
        else:
            if for_load:  # the state must exist for the checkpoint to load into it
                zero1 = isinstance(self.optimizer, Zero1AdamW)
                init_adamw_state(self.optimizer.inner if zero1 else self.optimizer)
            state = {"model": get_model_state_dict(self.model),
                     "optim_flat": flat_state(self.optimizer, self.model, self.dims.mesh)}
        state[trainer_key or f"trainer_rank{self.rank}"] = extra
        return state

    def load(self, url: str) -> None:
        manifest = self.checkpointer.inspect(url)
        saved = manifest.get("layout") or {}
        if saved.get("global_batch", self.global_batch) != self.global_batch:
            raise CheckpointError(
                f"checkpoint {url} was trained with a global batch of {saved['global_batch']} sequences, this run "
                f"has {self.global_batch}; resume with --global-batch-size {saved['global_batch']} (micro_batch_size"
                " x dp x accumulation), which keeps the data order and the optimizer's steps the same")
        same_world = saved.get("world", self.world_size) == self.world_size
        key = f"trainer_rank{self.rank}" if same_world else "trainer_rank0"  # every rank's RNG is seeded alike
        if not same_world and self.rank == 0:
            log.info("resuming a checkpoint of dp=%s x accum=%s on dp=%d x accum=%d (global batch %d)",
                     saved.get("dp"), saved.get("accum"), self.dims.dp, self.accum, self.global_batch)
        state = self.state_dict(for_load=True, trainer_key=key)
        self.checkpointer.load(url, state, manifest=manifest)
        if self.fsdp:
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        else:
            set_model_state_dict(self.model, state["model"])
            if "step" in state["optim_flat"]:
                set_step(self.optimizer, self.model, state["optim_flat"]["step"])
        trainer_state = load_trainer_state(state[key], url)  # weights_only: a checkpoint never runs code
        self.step = int(trainer_state["step"])
        self.schedule.load_state_dict(trainer_state["schedule"])
        try:
            self.loader.load_state_dict(trainer_state["loader"])
        except DataError as e:
            raise TrainingError(f"checkpoint {url}: {e}") from e
        set_rng_state(trainer_state["rng"])

    def save(self) -> str:
        with self.ledger.timed("checkpoint_save"):  # the blocking part (an async save goes on in the background)
            url = self.checkpointer.save(self.step, self.state_dict())
        self.ledger.saved(self.step, committed=not self.checkpointer.async_save)
        return url

    # -- the loop ---------------------------------------------------------------------------------
    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.cfg.parallel.precision == "bf16" and not self.fsdp:
            return torch.autocast(self.acc.device_type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step; returns (loss averaged over the global batch, grad norm) as tensors."""
        timer = self.step_timer  # per-phase times for straggler detection: no synchronisation
        timer.begin()
        loss_sum = torch.zeros((), device=self.device)
        for micro in range(self.accum):
            batch = torch.from_numpy(next(self.loader)).to(self.device, non_blocking=True)  # [B, S+1]
            timer.mark(DATA)
            inputs, targets = batch[:, :-1], batch[:, 1:]  # [B, S]
            if self.fsdp:
                self.model.set_requires_gradient_sync(micro == self.accum - 1)
            with self._autocast():
                logits = self.model(inputs)  # [B, S, V]; with loss parallel a DTensor sharded on V over the TP ranks
            with loss_context(self.loss_parallel):  # the loss and its backward on the shards (parallel.py)
                loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(0, 1))
                (loss / self.accum if self.accum > 1 else loss).backward()
            loss_sum += loss.detach().to_local() if self.loss_parallel else loss.detach()  # replicated over TP
            timer.mark(COMPUTE)
        timer.slow()  # the test hook STOKER_TEST_SLOW_RANK (a no-op otherwise)
        loss = loss_sum / self.accum
        align_grads(self.model)
        timer.mark(COMPUTE)
        if self.dp_group is not None:
            dist.all_reduce(loss, group=self.dp_group)
            loss /= self.dims.dp
            if not self.fsdp:
                allreduce_grads(self.model, self.dp_group, self.dims.dp)
        grad_norm = clip_grad_norm(self.model, self.cfg.train.grad_clip)
        timer.mark(COLLECTIVE)
        return loss, grad_norm

    def fit(self) -> dict[str, Any]:
        t = self.cfg.train
        tokens_per_step = self.global_batch * self.seq_len
        fpt = flops_per_token(self.model_cfg, self.seq_len)
        peak = self.acc.peak_flops(torch.bfloat16 if self.cfg.parallel.precision == "bf16" else torch.float32)
        writer = MetricsWriter(self.cfg.metrics_path, enabled=self.rank == 0, tensorboard=self.cfg.metrics.tensorboard,
                               progress=self.cfg.metrics.progress, total_steps=t.steps, start_step=self.step)
        losses: list[float] = []
        start_step, last_ckpt = self.step, self.resumed_from
        t_run = t_log = time.perf_counter()
        steps_since_log = 0
        stop_at = t.stop_after if t.stop_after else t.steps
        sigterm = _SigtermFlag()
        saved_at = self.step if self.resumed_from else -1
        stragglers, interval = StragglerMonitor.start(self), CheckpointInterval.start(self)
        self.ledger.loop_started(self.step, tokens_per_step, interval.every)
        # a gang with spares times its recovery up to this process's first step (distributed/generations.py)
        first_step_file = os.environ.get("STOKER_FIRST_STEP_FILE") if os.environ.get("RANK", "0") == "0" else None
        evict_file = os.environ.get("STOKER_EVICT_FILE") if os.environ.get("RANK", "0") == "0" else None
        try:
            while self.step < min(t.steps, stop_at):
                lr = self.schedule.apply()
                loss_t, norm_t = self.train_step()
                loss = float(loss_t)
                if not math.isfinite(loss):
                    raise TrainingError(
                        f"loss is {loss} at step {self.step + 1} (lr {lr:.3g}, grad norm {float(norm_t):.3g}); "
                        "hint: lower train.lr, raise train.warmup_steps, keep train.grad_clip > 0, use fp32 or "
                        f"check the data; resume from the last checkpoint ({last_ckpt or 'none yet'})"
                    )
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                self.schedule.step()
                self.step += 1
                if first_step_file:
                    _mark_time(first_step_file)
                    first_step_file = None
                stragglers.end_step(self.step)
                losses.append(loss)
                steps_since_log += 1
                if self.step % t.log_every == 0 or self.step == t.steps:
                    self.acc.synchronize()
                    now = time.perf_counter()
                    tps = steps_since_log * tokens_per_step / max(now - t_log, 1e-9)
                    record: dict[str, Any] = {
                        "step": self.step, "loss": loss, "lr": lr, "grad_norm": float(norm_t), "tokens_per_s": tps,
                        "flops_per_s": tps * fpt, "tokens": self.step * tokens_per_step,
                    }
                    if peak:
                        record["mfu"] = tps * fpt / (peak * self.world_size)
                    with contextlib.suppress(Exception):
                        record.update({f"mem_{k}": v for k, v in self.acc.memory_stats().items()})
                    record.update(stragglers.take())
                    writer.log(record)
                    self.ledger.window(self.step)
                    t_log, steps_since_log = now, 0
                else:
                    writer.advance(self.step)
                if interval.due(self.step) and self.step < t.steps:  # every N steps, or auto (train/interval.py)
                    last_ckpt, saved_at = interval.save(), self.step
                    if evict_file and (slow := stragglers.slow_node()) is not None:  # a spare may take its place
                        _mark_time(evict_file, {"node": slow["node"], "host": slow.get("host"), "step": self.step,
                                                "message": slow.get("message", "")})
                        evict_file = None
                if self.step < min(t.steps, stop_at) and sigterm.agreed(self.device):
                    if saved_at != self.step:
                        last_ckpt, saved_at = self.save(), self.step
                    self.checkpointer.finalize()  # committed (an async save too) before the process exits
                    raise Preempted(f"stopped by SIGTERM after step {self.step}; checkpoint {last_ckpt} is "
                                    "committed and a retry resumes from it", step=self.step)
            if self.cfg.checkpoint.save_final and (self.step == t.steps or t.stop_after) and self.step > start_step:
                last_ckpt = self.save()
            self.checkpointer.finalize()
        except TrainingError:
            self.checkpointer.finalize()  # commit a pending async save of the last good step
            raise
        finally:
            sigterm.restore()
            self.ledger.close(self.step)
            writer.close()
        elapsed = time.perf_counter() - t_run
        return {
            "step": self.step, "losses": losses, "final_loss": losses[-1] if losses else None,
            "checkpoint": last_ckpt, "checkpoint_dir": self.cfg.checkpoint_dir, "resumed_from": self.resumed_from,
            "tokens_per_s": (self.step - start_step) * tokens_per_step / elapsed if elapsed > 0 else 0.0,
            "tokens": self.step * tokens_per_step, "metrics_path": self.cfg.metrics_path,
            "num_params": self.model_cfg.num_params(), "world_size": self.world_size,
            "dp": self.dims.dp, "tp": self.dims.tp, "accum": self.accum, "seq_len": self.seq_len,
            "global_batch_size": self.global_batch,
        }


def load_initial_weights(model: Llama, source: str) -> None:
    """Fine-tuning start: weights from a Hugging Face folder (``config.json`` + safetensors) or from a
    stoker checkpoint (a ``step_XXXXXXXX`` folder or a checkpoint directory); shapes must match."""
    from stoker.train import hf

    if (Path(source) / "config.json").is_file():
        hf.load_hf_into(model, source)
    else:
        cfg, state, _ = hf.load_checkpoint_weights(source)
        shape = ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "ffn_dim")
        theirs, mine = ({k: getattr(c, k) for k in shape} for c in (cfg, model.cfg))
        if theirs != mine:
            raise CheckpointError(f"model.init_from={source} has shape {theirs} but the model has {mine}; "
                                  "pick the matching model config")
        model.load_state_dict(state, strict=True)
    log.info("initial weights from %s", source)


def _write_run_config(cfg: TrainConfig, model_cfg: Any) -> None:
    """The resolved config (with the full model shape) next to the run's metrics."""
    out = Path(cfg.metrics_path).parent
    with contextlib.suppress(OSError):
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps({**cfg.to_dict(), "model_shape": model_cfg.to_dict()}, indent=1))


def _init_distributed(acc: Any) -> bool:
    """Join the process group described by torchrun's environment; True when this call created it."""
    if dist.is_initialized() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    dist.init_process_group(backend=acc.dist_backend)
    return True


def _mark_time(path: str, doc: dict[str, Any] | None = None) -> None:
    """Write the time now (epoch seconds; with `doc`, `doc` and the time as JSON) to `path`, atomically; best
    effort. How a gang with spares hears of its first step and of a straggler to evict (distributed/generations.py)."""
    with contextlib.suppress(OSError):
        with open(f"{path}.tmp", "w") as f:
            f.write(json.dumps({**doc, "at": time.time()}) if doc is not None else repr(time.time()))
        os.replace(f"{path}.tmp", path)


def run_training(cfg: TrainConfig | dict[str, Any], *, resume_from: str | None = None) -> dict[str, Any]:
    """Train according to ``cfg`` (a :class:`TrainConfig` or its dict form) on this process's rank.

    Under ``torchrun`` (``WORLD_SIZE`` > 1) the process group is created here (and destroyed at the end)
    unless the caller made one. ``resume_from`` (or ``checkpoint.resume_from``) names a checkpoint or a
    checkpoint folder to continue from; otherwise ``checkpoint.resume='auto'`` continues from the newest
    valid checkpoint in ``checkpoint.dir``. Returns a summary dict (step, losses, checkpoint, tokens/s ...).
    """
    config = as_config(cfg)
    acc = _accelerator(config.train.accelerator)
    created = _init_distributed(acc)
    finished = False
    trainer: Trainer | None = None
    try:
        trainer = Trainer(config, resume_from=resume_from)
        result = trainer.fit()
        result["config"] = config.to_dict()
        finished = True
        return result
    except BaseException as exc:
        # the failed run's frames (the model, tensors and their autograd graph in their locals) would keep the
        # groups alive past their destruction, to the interpreter's exit; the traceback keeps its lines
        traceback.clear_frames(exc.__traceback__)
        raise
    finally:
        if trainer is not None:
            trainer.close()  # nothing of ours keeps a process group (or its gloo threads) past its destruction
        trainer = None
        gc.collect()  # FSDP2's module state sits in reference cycles: freed now, while the groups still exist
        if created:
            if finished:  # no rank tears its connections down while another still uses them (gloo aborts)
                dist.barrier()
            dist.destroy_process_group()
