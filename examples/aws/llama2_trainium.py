"""Llama-2-7B pretraining on Trainium with AWS Batch: NeuronX Distributed's (NxD) own Llama-2-7B training, as its
`tp_zero1_llama2_7B_hf_pretrain.sh` runs it, under torchrun on a gang of trn1.32xlarge nodes (one Batch multi-node
job), plus what the AWS Batch recipe and the Metaflow flow add: data on S3, checkpoints on S3, resume on retry.

1. Copy into this flow's folder (everything here travels in the code package), from aws-neuron/neuronx-distributed
   `examples/training/llama/` at the release of the Neuron container you use (the NxD training scripts need a
   Neuron SDK <= 2.29 image, the last with PyTorch/XLA training; see docs/aws.md):
       tp_zero1_llama_hf_pretrain/tp_zero1_llama_hf_pretrain.py   the script
       tp_zero1_llama_hf_pretrain/logger.py, modeling_llama_nxd.py, training_utils.py   the modules it imports
       tp_zero1_llama_hf_pretrain/7B_config_llama2/               the model config folder (--model_path)
       requirements.txt                                           its pins; `stoker image build` installs them
2. Infrastructure and image; the store is the bucket `infra apply` made (its `store_url` output):
       stoker infra apply --config examples/aws/infra.toml
       stoker image build examples/aws/llama2_trainium.py --push
       export STOKER_STORE=s3://my-stoker-bucket/stoker
3. The data, tokenized into 4096-token blocks as a Hugging Face dataset (the columns NxD reads), into the store's
   prefix, which the job role may read (`start` refuses to launch the gang until it is there):
       stoker data prepare hf:wikicorpus:raw_en:train --tokenizer PATH/TO/llama2/tokenizer.model --block-size 4096 \\
           --format hf --output "$STOKER_STORE/datasets/wikicorpus-llama2-4096"
4. A smoke run before the full one (docs/aws.md, "First real run"):
       python examples/aws/llama2_trainium.py run --dry-run          # the job definition and SubmitJob request
       python examples/aws/llama2_trainium.py run --smoke            # 2 nodes, 20 steps, a checkpoint: minutes
       python examples/aws/llama2_trainium.py run                    # 4 nodes x 32 NeuronCores, TP=8 + ZeRO-1

What stoker does on each node before the script starts: stages --data_dir from S3 to local disk (verified, cached
across retries), sets the collectives' interface (CCOM_SOCKET_IFNAME=eth0 on Batch) and NEURON_CC_FLAGS, raises the
open-files limit, fetches the Neuron compile cache, and runs the preflight (devices, EFA, the script's imports, the
data, disk, an all_reduce). Impossible settings (heads vs TP, batch vs DP) are refused by `plan` (@presubmit: before
the run is registered, and by `run --dry-run`), a dataset that is not there in `start`: before anything is submitted.
Hyperparameters are parameters: changing one never rebuilds the image.
"""

import json
import os

from stoker import FlowSpec, Parameter, batch, current, presubmit, retry, step, torchrun
from stoker.errors import ConfigError
from stoker.train.plan import check, nxd_llama_plan

HERE = os.path.dirname(os.path.abspath(__file__))
NXD_FILES = ("logger.py", "modeling_llama_nxd.py", "training_utils.py")  # the script's local imports
CORES_PER_NODE = 32  # a trn1.32xlarge: 16 Trainium chips x 2 NeuronCores


def check_dataset(url: str) -> None:
    """The dataset must be there before the gang starts: otherwise each paid node finds out (and @retry twice)."""
    if "://" in url and not url.startswith("file://"):
        from stoker.store.objects import open_objects

        there = bool(open_objects(url.rstrip("/"), error=ConfigError).list(""))
    else:
        there = os.path.exists(url.removeprefix("file://"))
    if not there:
        raise ConfigError(f"the dataset {url} does not exist (nothing is stored under it): make it with `stoker data "
                          f"prepare hf:wikicorpus:raw_en:train --tokenizer PATH/TO/llama2/tokenizer.model "
                          f"--block-size 4096 --format hf --output {url}`, or pass --data")


class Llama2Trainium(FlowSpec):
    nodes = Parameter("nodes", default=4, type=int, help="trn1.32xlarge nodes (the gang)")
    script = Parameter("script", default="tp_zero1_llama_hf_pretrain.py", help="NxD's training script")
    model_path = Parameter("model_path", default="7B_config_llama2", help="the model config folder (config.json)")
    data = Parameter("data", default="", help="the tokenized dataset (save_to_disk format); default: "
                     "$STOKER_STORE/datasets/wikicorpus-llama2-4096")
    steps = Parameter("steps", default=10000, type=int)
    lr = Parameter("lr", default=3e-4, type=float)
    warmup = Parameter("warmup", default=100, type=int)
    global_batch = Parameter("global_batch", default=1024, type=int)
    nproc = Parameter("nproc", default=0, type=int, help="processes per node (0: one per NeuronCore, 32)")
    checkpoint_every = Parameter("checkpoint_every", default=500, type=int, help="NxD saves only every N steps: "
                                 "pick a divisor of --steps, or the last steps are not kept")
    precompile = Parameter("precompile", default=True, type=bool,
                           help="neuron_parallel_compile 2 steps first (the recipe's DO_PRE_COMPILATION)")

    def nxd_args(self, nodes: int, nproc: int, data_dir: str = "", checkpoint_dir: str = "") -> dict:
        """The 7B script's flags (tp_zero1_llama2_7B_hf_pretrain.sh), with checkpoints and resume added."""
        tp, micro_batch = 8, 1
        dp = max(1, nodes * nproc // tp)
        return {
            "model_path": os.path.join(HERE, self.model_path), "data_dir": data_dir, "tensor_parallel_size": tp,
            "batch_size": micro_batch, "grad_accum_usteps": max(1, self.global_batch // (micro_batch * dp)),
            "max_steps": self.steps, "steps_this_run": -1, "warmup_steps": self.warmup, "lr": self.lr,
            "seq_len": 4096, "sequence_parallel_enabled": True, "selective_checkpoint_enabled": True,
            "logging_interval": 10, "use_mix_precision": True, "use_zero_1": True,
            # checkpoints go to the run's store (the recipe's CHECKPOINT_SAVE_URI; NxD writes s3:// itself), and a
            # retry of this step (a new gang) loads the newest committed one
            "checkpoint_dir": checkpoint_dir,
            "checkpoint_freq": self.checkpoint_every, "num_kept_checkpoint": 3, "loading_step": "latest_if_exists",
        }

    @presubmit
    def plan(self):
        """Refused before the run is registered, and by `run --dry-run`: what cannot work on the nodes."""
        missing = [f for f in (self.script, *NXD_FILES) if not os.path.exists(os.path.join(HERE, f))]
        if missing:
            raise ConfigError(f"{', '.join(missing)} not next to {__file__}: copy them from neuronx-distributed "
                              f"examples/training/llama/ (see this file's docstring)")
        config = os.path.join(HERE, self.model_path, "config.json")
        if not os.path.exists(config):
            raise ConfigError(f"{config} not found: copy NxD's tp_zero1_llama_hf_pretrain/7B_config_llama2/ next "
                              f"to this flow, or pass --model_path")
        nproc = self.nproc or CORES_PER_NODE
        if nproc > CORES_PER_NODE:
            raise ConfigError(f"--nproc {nproc}: a trn1.32xlarge has {CORES_PER_NODE} NeuronCores; use at most "
                              f"{CORES_PER_NODE} processes per node")
        check(nxd_llama_plan(self.nxd_args(self.nodes, nproc), json.load(open(config)), nodes=self.nodes,
                             nproc_per_node=nproc, global_batch=self.global_batch), "Llama2Trainium")

    @step
    def start(self):
        """The dataset must be in the store before anything is submitted (`plan` checked the rest)."""
        self.store = os.environ.get("STOKER_STORE") or current.store_url
        self.dataset = self.data or f"{self.store.rstrip('/')}/datasets/wikicorpus-llama2-4096"
        check_dataset(self.dataset)
        self.next(self.train, num_parallel=self.nodes)

    @retry(times=2, minutes_between_retries=0)  # a retry is a new gang that resumes from the last checkpoint
    @batch(trainium=16, efa=8, cpu=120, memory=480000, shared_memory=65536, instance_type="trn1.32xlarge")
    @torchrun  # nproc_per_node: 32, the NeuronCores of a trn1.32xlarge (derived and printed on each node)
    @step
    def train(self):
        nodes, nproc = current.parallel.num_nodes, self.nproc or CORES_PER_NODE  # a smoke run has fewer nodes
        args = self.nxd_args(nodes, nproc, data_dir=self.dataset,
                             checkpoint_dir=f"{self.store}/checkpoints/{current.flow_name}/{current.run_id}")
        args.update(output_dir=os.path.join(current.tempdir, "output"),
                    metrics_file=os.path.join(current.tempdir, "results.json"))
        config = os.path.join(HERE, self.model_path, "config.json")
        check(nxd_llama_plan(args, json.load(open(config)), nodes=nodes, nproc_per_node=nproc), "Llama2Trainium")
        current.torch.run(entrypoint=os.path.join(HERE, self.script), args=args, nproc_per_node=self.nproc or None,
                          stage=["data_dir"], precompile={"steps_this_run": 2} if self.precompile else None)
        self.next(self.join)

    @step
    def join(self, inputs):
        self.merge_artifacts(inputs, include=["store", "dataset"])
        self.next(self.end)

    @step
    def end(self):
        print(f"trained Llama-2-7B for {self.steps} steps on {self.nodes} trn1.32xlarge nodes; checkpoints in "
              f"{self.store}/checkpoints/{current.flow_name}/{current.run_id}")


if __name__ == "__main__":
    Llama2Trainium()
