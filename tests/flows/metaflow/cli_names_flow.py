"""Parameters named with underscores (`--num_items` on Metaflow's command line) and `separator=`."""

from metaflow import FlowSpec, Parameter, step


class CliNamesFlow(FlowSpec):
    """Metaflow uses a parameter's name verbatim as its option and splits `separator=` values into lists."""

    num_items = Parameter("num_items", default=2, type=int)
    names = Parameter("names", default="x,y", separator=",")

    @step
    def start(self):
        self.doubled = self.num_items * 2
        self.name_list = list(self.names)
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    CliNamesFlow()
