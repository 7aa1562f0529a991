"""Stands in for NxD's examples/training/llama/tp_zero1_llama_hf_pretrain/logger.py
(aws-neuron/neuronx-distributed@fbac349), test-only."""
