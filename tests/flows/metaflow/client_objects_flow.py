"""Client objects inside a run: sibling tasks change the run's tags, and a Task is stored as an artifact."""

from metaflow import FlowSpec, Run, current, step


class ClientObjectsFlow(FlowSpec):
    """Each foreach task adds and removes the same tags (as Metaflow's TagMutationTest); join stores a Task."""

    @step
    def start(self):
        self.items = list(range(4))
        self.next(self.mutate, foreach="items")

    @step
    def mutate(self):
        run = Run(f"{current.flow_name}/{current.run_id}")
        self.checks = []
        for i in range(7):
            tag = str(i)
            run.add_tag(tag)
            self.checks.append(tag in run.user_tags)
            run.remove_tag(tag)
            self.checks.append(tag not in run.user_tags)
        self.next(self.join)

    @step
    def join(self, inputs):
        self.all_ok = all(all(i.checks) for i in inputs)
        self.start_task = Run(f"{current.flow_name}/{current.run_id}")["start"].task
        self.next(self.end)

    @step
    def end(self):
        self.start_items = self.start_task.data.items
        self.start_step = self.start_task.pathspec.split("/")[2]


if __name__ == "__main__":
    ClientObjectsFlow()
