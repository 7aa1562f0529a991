"""A Config file (JSON) read as attributes and items in steps."""

from metaflow import Config, FlowSpec, step


class ConfigFlow(FlowSpec):
    """Reads its settings from cfg.json, or from the file given with `--config cfg PATH`."""

    cfg = Config("cfg", default="cfg.json")

    @step
    def start(self):
        self.lr = self.cfg.lr
        self.layers = self.cfg["model"]["layers"]
        self.next(self.end)

    @step
    def end(self):
        self.summary = f"{self.cfg.model.name}:{self.layers}:{self.lr}"


if __name__ == "__main__":
    ConfigFlow()
