"""Custom card types for custom_card_flow.py, registered as Metaflow users register them: a `metaflow_extensions`
package next to the flow with `plugins/cards/<package>/__init__.py` listing them in `CARDS`."""

import html
import time

from metaflow.cards import MetaflowCard


class ReportCard(MetaflowCard):
    """Renders the task's `scores` artifact, its options' title and the components appended to it."""

    type = "compat_report"
    ALLOW_USER_COMPONENTS = True

    def __init__(self, options={}, components=[], graph=None, flow=None, **kwargs):  # noqa: B006 - Metaflow's
        self.title = options.get("title", "untitled")
        self.components = components
        self.steps = sorted(graph or {})

    def render(self, task):
        parts = task.pathspec.split("/")
        comps = [[c.get("type"), [x.get("source") for x in c.get("contents", [])]] for c in self.components]
        return (f"<html><body><h1>{html.escape(self.title)}</h1><p>step={parts[2]} flow={parts[0]}</p>"
                f"<p>scores={sorted(task.data.scores.items())} via_item={task['scores'].data['a']}</p>"
                f"<p>components={comps}</p><p>graph={self.steps}</p>"
                f"<p>token={self.RELOAD_POLICY_TOKEN}</p></body></html>")


class LiveCard(MetaflowCard):
    """A runtime-updatable card: its final render shows the data of the last `refresh(data)`."""

    type = "compat_live"
    ALLOW_USER_COMPONENTS = True
    RUNTIME_UPDATABLE = True

    def __init__(self, options={}, components=[], graph=None, flow=None, **kwargs):  # noqa: B006 - Metaflow's
        pass

    def render_runtime(self, task, data):
        return f"<p>live {data['user']}</p>"

    def refresh(self, task, data):
        return data["user"]

    def render(self, task):
        d = self.runtime_data
        return f"<p>final user={d['user']} seq={d['render_seq']} mode={d['mode']}</p>"


class BrokenCard(MetaflowCard):
    type = "compat_broken"

    def render(self, task):
        raise ZeroDivisionError("the card's own bug")


class SlowCard(MetaflowCard):
    type = "compat_slow"

    def render(self, task):
        time.sleep(8)
        return "<p>too late</p>"


class EmptyCard(MetaflowCard):
    type = "compat_empty"

    def render(self, task):
        return None


CARDS = [ReportCard, LiveCard, BrokenCard, SlowCard, EmptyCard]
