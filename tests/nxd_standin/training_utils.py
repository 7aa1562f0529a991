"""Stands in for NxD's examples/training/llama/training_utils.py (aws-neuron/neuronx-distributed@fbac349), test-only."""
