"""One module per decorator: its declaration (arguments and their checks) and its behaviour, on the typed hooks
of `stoker.flow.decorators.StepDecorator`. Importing this package registers them all for `--with NAME:...`.

Adding a decorator is one new module here: a StepDecorator subclass that overrides the hooks it needs, ended by
`name = make_step_decorator(TheClass)`, and a line below (and in `stoker/__init__.py` to export it).
"""

from stoker.features.card import card
from stoker.features.catch import catch
from stoker.features.environment import environment
from stoker.features.monitor import monitor, neuron_monitor
from stoker.features.project import project
from stoker.features.resources import resources
from stoker.features.retry import retry
from stoker.features.secrets import get_secret, secrets
from stoker.features.timeout import timeout
from stoker.features.torchrun import torchrun
from stoker.features.user_wrappers import UserWrappers  # noqa: F401  (runs user step decorators in every task)
from stoker.flow.decorators import parallel, step

__all__ = ["card", "catch", "environment", "get_secret", "monitor", "neuron_monitor", "parallel", "project",
           "resources", "retry", "secrets", "step", "timeout", "torchrun"]
