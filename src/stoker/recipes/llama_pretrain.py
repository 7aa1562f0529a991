"""LlamaPretrain: prepare data -> train a gang (TP x ZeRO-1 over torchrun) -> evaluate -> export -> summary.

    python examples/llama_pretrain.py run                          # the embedded defaults (llama_pretrain.toml)
    python examples/llama_pretrain.py run --set train.steps=200     # override any value per run
    python examples/llama_pretrain.py run --config examples/configs/llama2_7b.toml --with batch

A retry of `train` (a rank died, a node was lost) restarts the gang, which resumes from the latest committed
checkpoint of this run; `resume` of a killed run resumes from the checkpoints of the run it continues.
"""

from __future__ import annotations

import difflib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stoker import Config, FlowSpec, current, monitor, retry, step, torchrun
from stoker.errors import ConfigError
from stoker.flow.parameters import load_config_file, parse_config_text
from stoker.train.plan import model_shape  # noqa: F401  (re-exported: the [model] section's shape, torch-free)

DEFAULT_CONFIG = Path(__file__).with_name("llama_pretrain.toml")
TRAIN_SECTIONS = ("train", "parallel", "checkpoint")


def _toml_value(v: object) -> str:
    return json.dumps(v)  # numbers, booleans, strings and flat lists read the same in TOML


def train_overrides(cfg: dict) -> list[str]:
    """The pipeline config's model/train/parallel/checkpoint sections as `stoker.train` --set items."""
    out = []
    for key, value in cfg.get("model", {}).items():
        out.append(f"model.{key}={_toml_value(value)}")
    for section in TRAIN_SECTIONS:
        for key, value in cfg.get(section, {}).items():
            out.append(f"{section}.{key}={_toml_value(value)}")
    return out


def checkpoint_root(run_id: str) -> str:
    """Checkpoints live next to the run in the store (a local folder here, s3://… on a cluster)."""
    return f"{current.store_url.rstrip('/')}/checkpoints/{current.flow_name}/{run_id}"


def committed(url: str) -> bool:
    from stoker.store.objects import open_objects

    return open_objects(url).exists("latest")


def merged_over_defaults(text: str) -> dict:
    """A ``--config`` file (TOML or JSON) is merged over the embedded defaults: give only what changes."""
    try:
        user = parse_config_text(text)
    except ValueError as exc:  # tomllib.TOMLDecodeError and json.JSONDecodeError are ValueErrors
        raise ConfigError(f"the --config file cannot be parsed ({exc}); fix it, or start from a copy of "
                          f"{DEFAULT_CONFIG}") from None
    return _merge(load_config_file(DEFAULT_CONFIG), user)


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def valid_settings() -> dict[str, set[str]]:
    """The keys of the sections that go to stoker.train, from its settings' dataclasses (torch-free)."""
    from stoker.train.settings import section_keys

    return {section: set(section_keys(section)) for section in ("model", *TRAIN_SECTIONS)}


def check_train_settings(cfg: dict, overrides: Mapping[str, Any] | None = None) -> None:
    """The model/train/parallel/checkpoint sections are stoker.train settings: a misspelt key fails here, before
    any task starts, in one line naming the key and the nearest valid one (inside the gang it would fail the
    same way on every node; stoker.train then exits with 78 and the scheduler does not retry it)."""
    given = set(overrides or {})
    for section, keys in valid_settings().items():
        for key in cfg.get(section) or {}:
            if key not in keys:
                dotted = f"{section}.{key}"
                near = difflib.get_close_matches(key, sorted(keys), n=1)
                where = f"--set {dotted}" if dotted in given else "the --config file"
                raise ConfigError(f"{where}: {dotted} is not a setting"
                                  + (f"; did you mean {section}.{near[0]}?" if near else "")
                                  + f" (valid in [{section}]: {', '.join(sorted(keys))})")


def _whole(low: int) -> tuple[Any, str]:
    return (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low), f"a whole number >= {low}"


def _number(test: Any, words: str) -> tuple[Any, str]:
    return (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and test(v)), words


_TEXT = ((lambda v: isinstance(v, str) and v.strip() != ""), "a non-empty string")
# The pipeline's own sections (what its steps read, not stoker.train's): each key with its test and its range in words
PIPELINE_SETTINGS: dict[str, dict[str, tuple[Any, str]]] = {
    "data": {"source": _TEXT, "tokenizer": _TEXT, "block_size": _whole(2),
             "val_fraction": _number(lambda v: 0 < v < 1, "a number > 0 and < 1 (the evaluate step needs a "
                                                          "validation split), e.g. 0.01")},
    "cluster": {"nodes": _whole(1), "nproc_per_node": _whole(1)},
    "evaluate": {"batches": _whole(1), "max_new_tokens": _whole(0), "top_k": _whole(0),
                 "temperature": _number(lambda v: 0 <= v < float("inf"), "a finite number >= 0 (0: greedy)"),
                 "prompts": ((lambda v: isinstance(v, list) and all(isinstance(p, str) for p in v)),
                             "a list of strings")},
}


def check_pipeline_values(cfg: dict, overrides: Mapping[str, Any] | None = None) -> None:
    """The [data], [cluster] and [evaluate] sections, which the pipeline's own steps read: a misspelt key or a value
    out of its range fails here, when the run starts, in one line naming the key and the range (not after the data
    is prepared, or in the gang, or in the evaluate step after training)."""
    given = set(overrides or {})
    for section, rules in PIPELINE_SETTINGS.items():
        values = cfg.get(section)
        if values is None:
            continue
        if not isinstance(values, Mapping):
            raise ConfigError(f"{section}={values!r}: expected a table ([{section}] with {', '.join(rules)})")
        for key, value in values.items():
            dotted = f"{section}.{key}"
            where = f"--set {dotted}" if dotted in given else "the --config file"
            if key not in rules:
                near = difflib.get_close_matches(key, sorted(rules), n=1)
                raise ConfigError(f"{where}: {dotted} is not a setting"
                                  + (f"; did you mean {section}.{near[0]}?" if near else "")
                                  + f" (valid in [{section}]: {', '.join(sorted(rules))})")
            test, words = rules[key]
            if not test(value):
                said = f"--set {dotted}={value!r}" if dotted in given else f"the --config file: {dotted}={value!r}"
                raise ConfigError(f"{said} is out of range: it must be {words}")


def pipeline_summary(flow: str, run_id: str, m: Mapping[str, Any], e: Mapping[str, Any], seconds: float,
                     checkpoint: str, export_dir: str, compute: str) -> str:
    """What the `end` step prints: the result in a few lines, and where to look next (the numbers themselves
    are artifacts: `metrics`, `result` with every loss, `eval`)."""
    loss = f"{m['final_loss']:.4f}" if m.get("final_loss") is not None else "-"
    return "\n".join([
        f"{flow} {run_id}: {m['step']} steps, {m['tokens']:,} tokens on {m['world_size']} ranks "
        f"(TP={m['tp']} x DP={m['dp']}), {m['tokens_per_s']:,.0f} tokens/s, "
        # the training time stoker.train printed (rank 0's), then the train step's, its start-up included
        + (f"training {m['seconds']:.1f} s (train step {seconds:.1f} s with its start-up)"
           if m.get("seconds") is not None else f"train step {seconds:.1f} s"),
        f"  final train loss {loss}, validation loss {e['val_loss']:.4f} (perplexity {e['val_perplexity']:.1f})",
        f"  checkpoint: {checkpoint}",
        f"  export (Hugging Face format): {export_dir}",
        f"  compute: {compute}",
        "next:",
        f"  stoker show {flow}/{run_id}   # steps, tasks and artifacts",
        "  stoker ui   # loss curves, per-rank and accelerator charts, cards",
        f"  python -c 'from stoker import Run; print(Run(\"{flow}/{run_id}\").data.metrics)'",
    ])


def check_train_values(cfg: dict) -> None:
    """The values of those sections, as stoker.train will read them (types, choices, ranges; the named model shape
    with its overrides): a bad one fails here, with stoker.train's own message, not on every node of the gang."""
    from stoker.train.config import from_dict

    sections = {s: dict(cfg.get(s) or {}) for s in ("model", *TRAIN_SECTIONS)}
    if sections["model"].get("init_from") and not sections["model"].get("name"):
        del sections["model"]  # its shape is the source's (read when training starts, from the store)
    from_dict(sections, source="the pipeline config")


def check_train_plan(cfg: dict) -> None:
    """Heads and KV heads vs parallel.tp, the global batch vs dp x micro-batch, the sequence vs the model's
    positions and the ranks vs tp: refused here, before data is prepared or a node is started."""
    from stoker.train.plan import check, stoker_train_plan

    plan = stoker_train_plan(cfg)  # None: the shape comes from model.init_from, known when training starts
    if plan is not None:
        check(plan, "the pipeline config")


class PipelineConfig(Config):
    """The pipeline's Config, checked against stoker.train's settings when the run starts."""

    def resolve(self, path: str | None = None, overrides: Mapping[str, Any] | None = None,
                base_dir: Path | None = None, ctx: Any = None) -> Any:
        value = super().resolve(path, overrides, base_dir, ctx)
        if value is not None:
            check_train_settings(value.to_dict(), overrides)
            check_pipeline_values(value.to_dict(), overrides)
            check_train_values(value.to_dict())
            check_train_plan(value.to_dict())
        return value


class LlamaPretrain(FlowSpec):
    """Pretrain a Llama-family model from a corpus, end to end."""

    config = PipelineConfig("config", default=str(DEFAULT_CONFIG), parser=merged_over_defaults,
                    help="pipeline TOML (data, cluster, model, train, ...), merged over the embedded defaults")

    @step
    def start(self):
        from stoker.data import prepare

        d = self.config.data
        t0 = time.time()
        self.data = prepare(source=d.source, tokenizer=d.tokenizer, block_size=d.block_size,
                            val_fraction=d.get("val_fraction", 0.0))
        self.prepare_seconds = time.time() - t0
        self.nodes = int(self.config.cluster.nodes)
        # the config's value, not self.nodes: a gang size read before the run starts is checked against the cluster
        # then (launch.check_units), not after data preparation
        self.next(self.train, num_parallel=int(self.config.cluster.nodes))

    @retry(times=2, minutes_between_retries=0)
    @monitor(interval=1)  # CPU, GPUs, NeuronCores of every node: charts in `stoker ui`, a card per node
    @torchrun
    @step
    def train(self):
        ckpt = checkpoint_root(current.run_id)
        # scratch, deleted with the task: the metrics and TensorBoard files also stream to the store (Task.metrics(),
        # `stoker ui`), and what is kept of the rest becomes artifacts below; checkpoints go to the store
        scratch = os.path.join(current.tempdir, "train")
        args = [f"--set={s}" for s in train_overrides(self.config.to_dict())]
        args += [f"--set=data.url={self.data.url}", f"--set=checkpoint.dir={ckpt}",
                 f"--set=out_dir={scratch}", "--set=checkpoint.resume=\"auto\""]
        if not committed(ckpt) and current.origin_run_id and committed(checkpoint_root(current.origin_run_id)):
            args.append(f"--set=checkpoint.resume_from={checkpoint_root(current.origin_run_id)}")
            print(f"resuming from the checkpoints of run {current.origin_run_id}", flush=True)
        result_file = os.path.join(current.tempdir, "result.json")
        t0 = time.time()
        current.torch.run(entrypoint="stoker.train", nproc_per_node=int(self.config.cluster.nproc_per_node),
                          args=args + [f"--result-file={result_file}"])
        self.train_seconds = time.time() - t0
        self.node = current.parallel.node_index
        self.result = json.load(open(result_file)) if os.path.exists(result_file) else None
        if self.result:  # rank 0's node: keep the resolved training config, drop the path into the scratch folder
            self.result.pop("metrics_path", None)
            resolved = os.path.join(scratch, "config.json")
            self.train_config = json.load(open(resolved)) if os.path.exists(resolved) else None
        self.next(self.join)

    @step
    def join(self, inputs):
        self.result = next(i.result for i in inputs if i.result)
        self.metrics = {k: self.result.get(k) for k in ("step", "final_loss", "tokens", "tokens_per_s",
                                                         "resumed_from", "world_size", "dp", "tp", "num_params",
                                                         "seconds")}
        self.checkpoint = self.result["checkpoint"]
        self.train_config = next(i.train_config for i in inputs if i.result)
        self.train_seconds = max(i.train_seconds for i in inputs)
        self.merge_artifacts(inputs, include=["data", "prepare_seconds", "nodes"])
        self.next(self.evaluate)

    @step
    def evaluate(self):
        from stoker.train.evaluate import evaluate_checkpoint

        e = self.config.evaluate
        self.eval = evaluate_checkpoint(self.checkpoint, self.data, split="val", batches=e.batches,
                                        tokenizer=self.config.data.tokenizer, prompts=list(e.prompts),
                                        max_new_tokens=e.max_new_tokens, temperature=e.get("temperature", 0.0),
                                        top_k=e.get("top_k", 0))
        for s in self.eval["samples"]:
            print(f"sample: {s['prompt']!r} -> {s['completion']!r}")
        self.next(self.export)

    @step
    def export(self):
        from stoker.data import load_tokenizer
        from stoker.train.hf import export_from_checkpoint

        target = f"{current.store_url.rstrip('/')}/exports/{current.flow_name}/{current.run_id}"
        remote = "://" in current.store_url
        tok = load_tokenizer(self.config.data.tokenizer)
        local = os.path.join(current.tempdir, "export") if remote else target
        self.export_dir = str(export_from_checkpoint(self.checkpoint, local, tokenizer=getattr(tok, "path", None)))
        if remote:  # written here, then uploaded next to the run in the store (s3://...), in parallel
            from pathlib import Path

            from stoker.store.objects import open_objects

            root = Path(self.export_dir)
            open_objects(target).put_many((f.relative_to(root).as_posix(), f) for f in sorted(root.rglob("*"))
                                          if f.is_file())
            self.export_dir = target
        self.next(self.end)

    @step
    def end(self):
        from stoker.backends.aws.cost import cost_headline

        print(pipeline_summary(current.flow_name, current.run_id, self.metrics, self.eval, self.train_seconds,
                               self.checkpoint, self.export_dir,
                               cost_headline(current.store_url, current.flow_name, current.run_id)))


if __name__ == "__main__":
    LlamaPretrain()
