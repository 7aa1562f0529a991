"""A torchrun gang whose ranks all_reduce in a loop for --seconds (a test kills one node's processes mid-loop, as a
host that dies would end them): the survivors' collective fails, the lost node writes nothing."""

from stoker import FlowSpec, Parameter, current, step, torchrun


class LostNodeFlow(FlowSpec):
    nodes = Parameter("nodes", default=2, type=int)
    seconds = Parameter("seconds", default=120, type=int)

    @step
    def start(self):
        self.next(self.train, num_parallel=self.nodes)

    @torchrun(nproc_per_node=1)
    @step
    def train(self):
        current.torch.run(entrypoint="lost_node_worker.py", args={"seconds": self.seconds})
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    LostNodeFlow()
