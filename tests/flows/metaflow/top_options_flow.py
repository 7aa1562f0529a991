"""A tiny flow run with Metaflow's top-level options and METAFLOW_USER: who ran it, and a parameter."""

from metaflow import FlowSpec, Parameter, current, step


class TopOptionsFlow(FlowSpec):
    """Records the user and namespace a task sees."""

    size = Parameter("size", default=1, type=int)

    @step
    def start(self):
        self.who = [current.username, current.namespace, sorted(current.tags)]
        self.next(self.end)

    @step
    def end(self):
        self.doubled = self.size * 2


if __name__ == "__main__":
    TopOptionsFlow()
