"""Llama-2-7B pretraining on Trainium with AWS Batch: the Neuron samples' NxD script under torchrun, on a gang of
trn1.32xlarge nodes (one Batch multi-node job), as the AWS Batch recipe and the Metaflow flow do it.

    stoker infra apply --config examples/aws/infra.toml          # queue, roles, EFA launch template, bucket, ECR
    stoker image build examples/aws/llama2_trainium.py --push     # the Neuron DLC + stoker, pushed to ECR
    export STOKER_STORE=s3://my-stoker-bucket/stoker
    python examples/aws/llama2_trainium.py run --nodes 4          # 4 x 32 NeuronCores: TP=8 + ZeRO-1
    python examples/aws/llama2_trainium.py run --dry-run --nodes 4   # the job definition and SubmitJob request

Put the training script and its files next to this flow first (they travel in the code package):
`tp_zero1_llama_hf_pretrain.py`, `modeling_llama_nxd.py`, `adamw_fp32_optim_params.py`, `config.json` from
aws-neuron/neuronx-distributed `examples/training/llama/`. The tokenized dataset (4096-token blocks) is an S3
prefix given with --data. Hyperparameters are parameters: changing one never rebuilds the image.
"""

import os

from stoker import FlowSpec, Parameter, batch, current, retry, step, torchrun


class Llama2Trainium(FlowSpec):
    nodes = Parameter("nodes", default=4, type=int, help="trn1.32xlarge nodes (the gang)")
    script = Parameter("script", default="tp_zero1_llama_hf_pretrain.py", help="the NxD training script")
    data = Parameter("data", default="s3://my-stoker-bucket/datasets/wikicorpus-llama2-4096/",
                     help="the tokenized dataset (the recipe's TOKENIZED_DATASET_URI)")
    steps = Parameter("steps", default=10000, type=int)
    lr = Parameter("lr", default=3e-4, type=float)
    warmup = Parameter("warmup", default=100, type=int)
    global_batch = Parameter("global_batch", default=1024, type=int)
    precompile = Parameter("precompile", default=True, type=bool,
                           help="neuron_parallel_compile a few steps first (the recipe's DO_PRE_COMPILATION)")

    @step
    def start(self):
        self.next(self.train, num_parallel=self.nodes)

    @retry(times=2, minutes_between_retries=0)  # a retry is a new gang that resumes from the last checkpoint
    @batch(trainium=16, efa=8, cpu=120, memory=480000, shared_memory=65536, instance_type="trn1.32xlarge")
    @torchrun  # nproc_per_node: 32, the NeuronCores of a trn1.32xlarge
    @step
    def train(self):
        ranks = 32 * current.parallel.num_nodes
        tp = 8
        micro_batch = 1
        args = {
            "model_path": "config.json", "data_dir": self.data, "tensor_parallel_size": tp,
            "batch_size": micro_batch, "grad_accum_usteps": max(1, self.global_batch // (micro_batch * ranks // tp)),
            "max_steps": self.steps, "steps_this_run": self.steps, "warmup_steps": self.warmup, "lr": self.lr,
            "seq_len": 4096, "use_zero_1": True, "use_mix_precision": True, "sequence_parallel_enabled": True,
            "selective_checkpoint_enabled": True, "logging_interval": 10, "qkv_linear": True, "kv_replicator": 4,
            # checkpoints go straight to the run's store (the recipe's CHECKPOINT_SAVE_URI), every 500 steps,
            # and a retry of this step loads the newest one
            "checkpoint_dir": f"{os.environ.get('STOKER_STORE', 's3://my-stoker-bucket/stoker')}/checkpoints/"
                              f"{current.flow_name}/{current.run_id}",
            "checkpoint_freq": 500, "num_kept_checkpoint": 3, "loading_step": "latest_if_exists",
        }
        current.torch.run(entrypoint=self.script, args=args,
                          precompile={"steps_this_run": 2} if self.precompile else None)
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        print(f"trained Llama-2-7B for {self.steps} steps on {self.nodes} trn1.32xlarge nodes")


if __name__ == "__main__":
    Llama2Trainium()
