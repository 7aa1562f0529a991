"""A gang sized by a Config value, as the pipeline recipe's `cluster.nodes`: a size known before the run starts, so a
gang larger than the cluster is refused then, before `start` runs."""

from stoker import Config, FlowSpec, current, parallel, step


class ConfigGangFlow(FlowSpec):
    cfg = Config("cfg", default_value={"cluster": {"nodes": 2}})

    @step
    def start(self):
        print("start ran", flush=True)
        self.next(self.work, num_parallel=int(self.cfg.cluster.nodes))

    @parallel
    @step
    def work(self):
        self.node = current.parallel.node_index
        self.next(self.join)

    @step
    def join(self, inputs):
        self.nodes = sorted(i.node for i in inputs)
        self.next(self.end)

    @step
    def end(self):
        print("nodes", self.nodes)


if __name__ == "__main__":
    ConfigGangFlow()
