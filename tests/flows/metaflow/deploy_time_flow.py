"""A Parameter whose default is a function of Metaflow's ParameterContext (a deploy-time default)."""

from metaflow import FlowSpec, Parameter, step


def default_label(ctx):
    return f"{ctx.flow_name}-{ctx.parameter_name}"


class DeployTimeFlow(FlowSpec):
    """Callable defaults are called with a context (flow_name, user_name, parameter_name, ...)."""

    label = Parameter("label", type=str, default=default_label)
    size = Parameter("size", type=int, default=lambda ctx: 7)

    @step
    def start(self):
        self.described = f"{self.label}:{self.size}"
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    DeployTimeFlow()
