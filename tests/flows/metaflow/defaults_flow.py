"""Functions as defaults: a Config's default_value and a Parameter's default computed from the context."""

import json

from metaflow import Config, FlowSpec, Parameter, current, project, step


def cfg_default(ctx):
    return {"size": 3, "nested": {"value": 5, "items": [{"a": 1}]}, "who": ctx.parameter_name,
            "had_configs": ctx.configs is not None}


def path_default(ctx):
    with open("side.json", "w") as f:
        json.dump({"from": "file"}, f)
    return "side.json"


def size_default(ctx):
    return ctx.configs.cfg.size * 2


def names_default(ctx):
    return ",".join(sorted(ctx.configs))


def proj_default(ctx):
    return f"{current.project_name}|{current.branch_name}"


@project(name="defproj")
class DefaultsFlow(FlowSpec):
    cfg = Config("cfg", default_value=cfg_default)
    side = Config("side", default=path_default)
    size = Parameter("size", type=int, default=size_default)
    names = Parameter("names", type=str, default=names_default)
    proj = Parameter("proj", type=str, default=proj_default)

    @step
    def start(self):
        self.nested_value = self.cfg["nested"].value
        self.item_a = self.cfg.nested["items"][0].a
        self.item_type = type(self.cfg["nested"]).__name__
        self.errors = {}
        for what, fn in (("setitem", lambda: self.cfg.__setitem__("k", 1)),
                         ("nested_setitem", lambda: self.cfg["nested"].__setitem__("k", 1)),
                         ("setattr", lambda: setattr(self.cfg, "k", 1)),
                         ("update", lambda: self.cfg.update({"k": 1}))):
            try:
                fn()
                self.errors[what] = None
            except Exception as e:
                self.errors[what] = type(e).__name__
        self.cfg_plain = self.cfg.to_dict()
        self.side_from = self.side["from"]
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    DefaultsFlow()
