"""Issue 25: a gang sized by a Config value (the pipeline recipe's `cluster.nodes`) is known before the run starts,
so launch.check_units refuses a gang larger than the cluster before `start` runs (the real-cluster test is
tests/integration/test_slurm_faults.py)."""

from __future__ import annotations

from stoker.flow.configs import ConfigValue
from stoker.flow.graph import FlowGraph
from stoker.flow.parameters import Config, Parameter, gang_size
from stoker.recipes import llama_pretrain

PARAMS = {"cfg": Config("cfg", default_value={"cluster": {"nodes": 2}}), "n": Parameter("n", default=3, type=int)}
VALUES = {"cfg": ConfigValue({"cluster": {"nodes": 4, "name": "x"}, "f": 2.0}), "n": 5}


def test_a_config_value_sizes_the_gang():
    assert gang_size("self.cfg.cluster.nodes", PARAMS, VALUES) == 4
    assert gang_size("int(self.cfg.cluster.nodes)", PARAMS, VALUES) == 4
    assert gang_size("int(self.n)", PARAMS, VALUES) == 5
    assert gang_size("self.cfg.f", PARAMS, VALUES) == 2, "a whole float (as TOML may give it)"
    assert gang_size("self.cfg.cluster.f", PARAMS, VALUES) is None
    assert gang_size("self.cfg.cluster.name", PARAMS, VALUES) is None, "not a number"
    assert gang_size("self.cfg.cluster.nodes", PARAMS) is None, "the config is not resolved yet (a dry run)"
    assert gang_size("self.other.cluster.nodes", PARAMS, VALUES) is None


def test_the_pipeline_recipe_sizes_its_gang_from_its_config():
    graph = FlowGraph(llama_pretrain.LlamaPretrain)
    assert graph["start"].num_parallel == "int(self.config.cluster.nodes)"
    params = llama_pretrain.LlamaPretrain._run_inputs()
    assert gang_size(graph["start"].num_parallel, params, {"config": ConfigValue({"cluster": {"nodes": 3}})}) == 3
