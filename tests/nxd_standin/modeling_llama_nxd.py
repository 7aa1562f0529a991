"""Stands in for NxD's examples/training/llama/modeling_llama_nxd.py (aws-neuron/neuronx-distributed@fbac349),
test-only."""
