"""What a node of a distributed (`@torchrun`) step does around its command, below the runtime and the features:
what the node has and needs (`accel`: devices, the EFA / Neuron environment, processes per node), its inputs
staged to local disk (`stage`), the gang's preflight (`preflight`), the Neuron compile cache (`neuron_cache`),
`run --smoke` (`smoke`), and torchrun itself (`torchrun`: `current.torch.run`)."""
