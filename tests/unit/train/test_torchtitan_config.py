"""A torchtitan JobConfig TOML runs under ``python -m stoker.train --config`` (issue 14, part 4): every key
maps to its stoker setting, warns (speed/logging features stoker lacks) or fails with one line naming it."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from stoker.errors import ConfigError
from stoker.train.config import load_config
from stoker.train.settings import get_model_config
from stoker.train.torchtitan import FLAVORS, SPEC, convert, is_torchtitan, is_torchtitan_key

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "torchtitan" / "llama3_debug.toml"


def _example() -> dict:
    return tomllib.loads(EXAMPLE.read_text())


def _titan(**sections: dict) -> dict:
    """A minimal torchtitan document: a .npy token file (no tokenizing) plus the given sections."""
    raw = {"job": {"dump_folder": "/tmp/out"}, "training": {"dataset_path": "/tmp/tokens.npy", "seq_len": 32}}
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return raw


@pytest.fixture
def tokens(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.npy"
    np.save(path, np.arange(4096, dtype=np.uint16) % 250)
    return path


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "titan.toml"
    path.write_text(text)
    return path


def test_the_example_maps_every_section() -> None:
    """torchtitan's debug_model.toml (as adapted in examples/) becomes the stoker settings it means."""
    out = convert(_example(), source=str(EXAMPLE), world_size=1, prepare_data=False)
    assert out["out_dir"] == "./runs/llama3_debug"
    assert out["model"] == {"name": "llama3-debugmodel", "max_seq_len": 256}
    t = out["train"]
    assert (t["steps"], t["micro_batch_size"], t["lr"], t["eps"], t["grad_clip"], t["warmup_steps"]) == \
        (10, 4, 8e-4, 1e-8, 1.0, 2)
    assert (t["schedule"], t["min_lr"], t["log_every"], t["weight_decay"]) == ("linear", 0.0, 1, 0.1)
    assert out["parallel"] == {"precision": "fp32", "tp": 1, "sequence_parallel": False, "loss_parallel": True,
                               "dp": -1, "dp_mode": "fsdp", "compile": False, "activation_checkpoint": "selective"}
    assert out["checkpoint"] == {"dir": "runs/llama3_debug/checkpoint", "every": 5, "keep": 10,
                                 "async_save": False, "save_final": True, "resume": "auto"}
    assert out["metrics"] == {"tensorboard": False, "progress": True}


def test_format_is_detected_by_sections() -> None:
    assert is_torchtitan(_example())
    assert not is_torchtitan({"model": {"name": "tiny"}, "train": {"steps": 3}, "checkpoint": {"every": 1}})
    assert is_torchtitan_key("training.steps") and is_torchtitan_key("checkpoint.interval")
    assert not is_torchtitan_key("checkpoint.every") and not is_torchtitan_key("train.lr")


def test_load_config_reads_a_torchtitan_file(tmp_path: Path, tokens: Path) -> None:
    """Auto-detected; torchtitan overrides change the file, stoker's the result; defaults are torchtitan's."""
    path = _write(tmp_path, f'[job]\ndump_folder = "{tmp_path}/out"\n[training]\ndataset_path = "{tokens}"\n'
                            'seq_len = 32\nsteps = 7\n[checkpoint]\nenable = true\ninterval = 2\n')
    cfg = load_config(path, ["training.steps=3", "optimizer.lr=1e-3", "train.seed=5", "checkpoint.keep_latest_k=0"])
    assert cfg.train.steps == 3 and cfg.train.lr == 1e-3 and cfg.train.seed == 5
    assert cfg.train.micro_batch_size == 8 and cfg.train.warmup_steps == 200  # torchtitan's defaults
    assert cfg.parallel.precision == "bf16" and cfg.parallel.activation_checkpoint == "selective"
    assert cfg.data.url == str(tokens) and cfg.data.block_size == 33
    assert cfg.model.resolve().max_seq_len == 32 and cfg.model.resolve().vocab_size == 2048
    assert cfg.checkpoint.dir == f"{tmp_path}/out/checkpoint" and cfg.checkpoint.every == 2
    assert cfg.checkpoint.keep == 2**31 - 1
    forced = load_config(path, config_format="torchtitan")
    assert forced.train.steps == 7
    with pytest.raises(ConfigError, match="unknown section or setting 'job'"):
        load_config(path, config_format="stoker")


def test_data_flag_replaces_the_dataset(tmp_path: Path, tokens: Path) -> None:
    """--data skips torchtitan's dataset (c4_test is not bundled), as stoker's own flag does."""
    path = _write(tmp_path, '[training]\ndataset = "c4_test"\nseq_len = 16\n')
    cfg = load_config(path, [f"data={tokens}"])
    assert cfg.data.url == str(tokens)
    with pytest.raises(ConfigError, match="training.dataset = 'c4_test' is torchtitan's C4 loader"):
        load_config(path)


def test_vocab_and_block_come_from_a_prepared_dataset(tmp_path: Path) -> None:
    """The embedding is sized by the data's tokenizer; blocks that do not hold seq_len + 1 tokens are refused."""
    data = tmp_path / "ds"
    data.mkdir()
    (data / "manifest.json").write_text('{"block_size": 33, "tokenizer": {"vocab_size": 500}}')
    path = _write(tmp_path, f'[training]\ndataset_path = "{data}"\nseq_len = 32\n')
    cfg = load_config(path)
    assert cfg.data.url == str(data) and cfg.model.resolve().vocab_size == 500
    assert load_config(path, ["model.vocab_size=512"]).model.resolve().vocab_size == 512
    with pytest.raises(ConfigError, match="holds blocks of 33 tokens .* training.seq_len = 64: set seq_len = 32"):
        load_config(path, ["training.seq_len=64"])


def test_cli_error_is_one_line_without_traceback(tmp_path: Path) -> None:
    path = _write(tmp_path, '[training]\ndataset_path = "t.npy"\n[parallelism]\npipeline_parallel_degree = 4\n')
    p = subprocess.run([sys.executable, "-m", "stoker.train", "--config", str(path), "--print-config"],
                       capture_output=True, text=True, timeout=120, env=os.environ)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert "parallelism.pipeline_parallel_degree = 4 is not supported: stoker has no pipeline parallelism" in p.stderr
    bad = subprocess.run([sys.executable, "-m", "stoker.train", "--config", str(path), "--config-format", "titan"],
                         capture_output=True, text=True, timeout=120, env=os.environ)
    assert bad.returncode != 0 and "--config-format 'titan': use one of" in bad.stderr


@pytest.mark.parametrize("flavor", sorted(FLAVORS))
def test_flavors_have_torchtitans_shapes(flavor: str) -> None:
    """FFN width by torchtitan's rule (int(2*4d/3), x multiplier, rounded up to multiple_of), heads, RoPE."""
    dims = {"debugmodel": (256, 6, 16, 16, 256, None, 2048), "debugmodel_flex_attn": (256, 6, 16, 16, 256, None, 2048),
            "8B": (4096, 32, 32, 8, 1024, 1.3, 128256), "70B": (8192, 80, 64, 8, 4096, 1.3, 128256),
            "405B": (16384, 126, 128, 8, 4096, 1.2, 128256)}[flavor]
    dim, layers, heads, kv, multiple_of, multiplier, vocab = dims
    hidden = int(2 * 4 * dim / 3)
    if multiplier:
        hidden = int(multiplier * hidden)
    hidden = multiple_of * ((hidden + multiple_of - 1) // multiple_of)
    cfg = get_model_config(FLAVORS[flavor])
    assert (cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim, cfg.vocab_size) == \
        (dim, layers, heads, kv, hidden, vocab)
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling["factor"] == 8.0 and not cfg.tie_embeddings


@pytest.mark.parametrize("world, par, expected", [
    (1, {}, {"dp": -1, "dp_mode": "fsdp", "tp": 1}),
    (4, {"data_parallel_shard_degree": 2, "tensor_parallel_degree": 2}, {"dp": 2, "dp_mode": "fsdp", "tp": 2}),
    (2, {"data_parallel_replicate_degree": 2}, {"dp": 2, "dp_mode": "ddp", "tp": 1}),
    (2, {"data_parallel_replicate_degree": 2, "data_parallel_shard_degree": 1}, {"dp": 2, "dp_mode": "ddp"}),
    (2, {"tensor_parallel_degree": 2, "disable_loss_parallel": True}, {"tp": 2, "loss_parallel": False}),
])
def test_parallelism_degrees(world: int, par: dict, expected: dict) -> None:
    out = convert(_titan(parallelism=par), world_size=world, prepare_data=False)["parallel"]
    assert {k: out[k] for k in expected} == expected
    assert out["sequence_parallel"] == (out["tp"] > 1)  # torchtitan's TP shards the norms too


def test_schedule_checkpoint_and_older_key_names() -> None:
    out = convert(_titan(optimizer={"lr": 1e-3}, lr_scheduler={"lr_min": 0.1, "decay_type": "cosine"},
                         training={"batch_size": 2, "global_batch_size": 16, "compile": True, "seed": 3},
                         checkpoint={"enable_checkpoint": True, "folder": "ck", "load_step": 40,
                                     "async_mode": "async", "last_save_model_only": False},
                         metrics={"disable_color_printing": True, "enable_tensorboard": True}),
                  world_size=1, prepare_data=False)
    assert out["train"]["min_lr"] == pytest.approx(1e-4) and out["train"]["schedule"] == "cosine"
    assert (out["train"]["micro_batch_size"], out["train"]["global_batch_size"], out["train"]["seed"]) == (2, 16, 3)
    assert out["parallel"]["compile"] is True
    assert out["checkpoint"]["dir"] == "/tmp/out/ck" and out["checkpoint"]["async_save"] is True
    assert out["checkpoint"]["resume_from"] == "/tmp/out/ck/step_00000040"
    assert out["metrics"] == {"tensorboard": True, "progress": False}
    off = convert(_titan(), world_size=1, prepare_data=False)["checkpoint"]
    assert off == {"every": 0, "save_final": False, "resume": "never"}  # torchtitan's default: no checkpoints
    load = {"enable": True, "initial_load_path": "/w/Llama-3.2-1B", "initial_load_in_hf": True}
    hf = convert(_titan(checkpoint=load), world_size=1, prepare_data=False)
    assert hf["model"]["init_from"] == "/w/Llama-3.2-1B"
    raw = _titan(checkpoint={"enable": True, "skip_last_save": True}, training={"dataloader": {"num_workers": 2}})
    skip = convert(raw, world_size=1, prepare_data=False)["checkpoint"]
    assert skip["save_final"] is False and skip["every"] == 500
    load_only = convert(_titan(checkpoint={"enable": True, "load_only": True}), world_size=1, prepare_data=False)
    assert (load_only["checkpoint"]["every"], load_only["checkpoint"]["save_final"]) == (0, False)


@pytest.mark.parametrize("sections, message", [
    ({"parallelism": {"pipeline_parallel_degree": 2}},
     "parallelism.pipeline_parallel_degree = 2 is not supported: stoker has no pipeline parallelism"),
    ({"parallelism": {"context_parallel_degree": 2}}, "parallelism.context_parallel_degree = 2 is not supported"),
    ({"model": {"converters": ["float8"]}}, r"model.converters = \['float8'\] is not supported: stoker has no float8"),
    ({"lr_scheduler": {"decay_type": "sqrt"}}, "lr_scheduler.decay_type = 'sqrt' is not supported"),
    ({"lr_scheduler": {"warmup_steps": 2, "decay_ratio": 0.5}, "training": {"steps": 10}},
     "decay_ratio = 0.5 gives a stable phase of 3 steps .* set it to 0.8"),
    ({"parallelism": {"data_parallel_replicate_degree": 2, "data_parallel_shard_degree": 2}}, r"\(HSDP\) is not"),
    ({"training": {"enable_cpu_offload": True}}, "training.enable_cpu_offload = True is not supported"),
    ({"optimizer": {"name": "Muon"}}, "optimizer.name = 'Muon' is not supported"),
    ({"model": {"name": "deepseek_v3"}}, "model.name = 'deepseek_v3' is not supported"),
    ({"model": {"flavor": "3B"}}, "model.flavor = '3B' is not a torchtitan llama3 flavor"),
    ({"activation_checkpoint": {"mode": "memory_budget"}}, "activation_checkpoint.mode = 'memory_budget'"),
    ({"training": {"stepz": 3}}, r"unknown torchtitan key training.stepz; known in \[training\]"),
    ({"profiler": {"enable": True}}, r"unknown torchtitan section \[profiler\]"),
    ({"train": {"steps": 3}}, r"\[train\] is stoker's format but the file is torchtitan's"),
    ({"training": {"steps": "ten"}}, "training.steps = 'ten': expected int"),
    ({"lr_scheduler": {"decay_ratio": "most"}}, "lr_scheduler.decay_ratio = 'most': expected float"),
    ({"fault_tolerance": {"enable": True}}, "fault_tolerance.enable = True is not supported"),
    ({"training": {"max_steps": 20}}, "training.max_steps = 20 is not supported: stoker's schedule decays over"),
    ({"training": {"dtype": "bfloat16"}}, "training.dtype = 'bfloat16' is not supported: stoker keeps fp32 master"),
    ({"checkpoint": {"enable": True, "initial_load_path": "/x", "initial_load_model_only": False}},
     "initial_load_model_only = false is not supported"),
])
def test_unsupported_keys_fail_with_one_line(sections: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as e:
        convert(_titan(**sections), world_size=1, prepare_data=False)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("sections, message", [
    ({"metrics": {"enable_wandb": True}}, "metrics.enable_wandb = True is ignored: no Weights & Biases"),
    ({"training": {"deterministic": True}}, "training.deterministic = True is ignored"),
    ({"parallelism": {"fsdp_reshard_after_forward": "never"}}, "fsdp_reshard_after_forward = 'never' is ignored"),
    ({"activation_checkpoint": {"selective_ac_option": "2"}}, "selective checkpointing is per op"),
    ({"checkpoint": {"enable": True}}, "last_save_model_only = true: stoker's last checkpoint also keeps"),
    ({"validation": {"enabled": True, "freq": 5}}, "validation.enabled = True is ignored: evaluate after training"),
    ({"lr_scheduler": {"warmup_steps": 2, "decay_ratio": 0.8}, "training": {"steps": 4}},
     "exceed the 4 steps; stoker decays over the 2 steps after warmup"),
])
def test_harmless_keys_warn(sections: dict, message: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="stoker.train.torchtitan"):
        convert(_titan(**sections), world_size=1, prepare_data=False)
    assert any(message in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_defaults_and_disabled_features_are_silent(caplog: pytest.LogCaptureFixture) -> None:
    """float8 settings without a float8 converter, profiling folders and descriptions say nothing."""
    raw = _titan(float8={"filter_fqns": ["output"]}, profiling={"save_traces_folder": "p"},
                 job={"description": "x"}, activation_checkpoint={"selective_ac_option": "op"})
    with caplog.at_level(logging.WARNING, logger="stoker.train.torchtitan"):
        convert(raw, world_size=1, prepare_data=False)
    assert not caplog.records


def test_the_doc_lists_every_key() -> None:
    doc = (ROOT / "docs" / "from-torchtitan.md").read_text()
    missing = [f"{s}.{k}" for s, keys in SPEC.items() for k in keys if f"`{s}.{k}`" not in doc]
    assert not missing, f"docs/from-torchtitan.md does not mention {missing}"


@pytest.mark.slow
def test_the_example_trains_end_to_end(tmp_path: Path) -> None:
    """python -m stoker.train --config examples/torchtitan/llama3_debug.toml, as the doc says (4 steps)."""
    env = {**os.environ, "STOKER_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT / "src")}
    p = subprocess.run([sys.executable, "-m", "stoker.train", "--config", str(EXAMPLE.relative_to(ROOT)),
                        "--job.dump_folder", str(tmp_path / "out"), "--training.steps", "4"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    metrics = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == 4  # metrics.log_freq = 1
    assert (tmp_path / "out" / "checkpoint" / "step_00000004" / "manifest.json").is_file()
    assert "Traceback" not in p.stderr
