"""The flow and step API: `current`, class constants, a gang's `self.input`, merge_artifacts, env parameters."""

import os

from metaflow import FlowSpec, Parameter, current, parallel, step


def _error(fn):
    """(exception type name, message) of what fn() raises, or None."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - what the engine raises is what is compared
        return [type(e).__name__, str(e)]
    return None


class FlowApiFlow(FlowSpec):
    """Records what a step sees of `current` and what the engine refuses."""

    LIMIT = 5
    alpha = Parameter("alpha", default=1, type=int)
    my_param = Parameter("my-param", default="d")
    flag = Parameter("flag", default=False, type=bool)

    @step
    def start(self):
        self.cur = {
            "flow_name": current.flow_name, "run_id": current.run_id, "step_name": current.step_name,
            "task_id": current.task_id, "pathspec": current.pathspec, "retry_count": current.retry_count,
            "origin_run_id": current.origin_run_id, "is_running_flow": current.is_running_flow,
            "username": current.username, "namespace": current.namespace,
            "tempdir_is_dir": os.path.isdir(current.tempdir),
            "parameter_names": sorted(current.parameter_names),
            "task_pathspec": current.task.pathspec, "run_pathspec": current.run.pathspec,
            "in": ["run_id" in current, "no_such" in current], "get": current.get("no_such", "dflt"),
        }
        g = current.graph
        self.graph = {"steps": {s: [v["type"], v["next"]] for s, v in g["steps"].items()}, "file": g["file"],
                      "ends": [g["start_step"], g["end_step"]], "doc": g["doc"]}
        self.params = [self.alpha, self.my_param, self.flag]
        self.set_const = _error(lambda: setattr(self, "LIMIT", 6))
        self.set_param = _error(lambda: setattr(self, "alpha", 6))
        self.limit = self.LIMIT
        self.not_join = _error(lambda: self.merge_artifacts([]))
        self.next(self.gang, num_parallel=2)

    @parallel
    @step
    def gang(self):
        self.node = [self.input, current.parallel.node_index, current.parallel.num_nodes, self.index,
                     [list(f) for f in self.foreach_stack()]]
        self.next(self.gang_join)

    @step
    def gang_join(self, inputs):
        self.nodes = sorted(i.node for i in inputs)
        self.join_inputs = sorted([i.input, i.index] for i in inputs)
        self.next(self.fan)

    @step
    def fan(self):
        self.next(self.a, self.b)

    @step
    def a(self):
        self.x = 1
        self.same = "s"
        self.only_a = "a"
        self.next(self.join)

    @step
    def b(self):
        self.x = 2
        self.same = "s"
        self.next(self.join)

    @step
    def join(self, inputs):
        self.conflict = _error(lambda: self.merge_artifacts(inputs))
        self.set_after_conflict = [hasattr(self, "same"), hasattr(self, "only_a")]
        self.missing = _error(lambda: self.merge_artifacts(inputs, include=["nope"]))
        self.both_kw = _error(lambda: self.merge_artifacts(inputs, include=["same"], exclude=["x"]))
        self.x = max(i.x for i in inputs)
        self.merge_artifacts(inputs)
        self.merged = [self.same, self.only_a, self.x]
        self.join_params = sorted(current.parameter_names)
        self.next(self.end)

    @step
    def end(self):
        self.end_const = _error(lambda: setattr(self, "LIMIT", 7))


if __name__ == "__main__":
    FlowApiFlow()
