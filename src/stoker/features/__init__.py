"""One module per decorator: its declaration (arguments and their checks) and its behaviour, on the typed hooks
of `stoker.flow.decorators.StepDecorator`. Importing this package registers them all for `--with NAME:...`.

Adding a decorator is one new module here: a StepDecorator subclass that overrides the hooks it needs, ended by
`name = make_step_decorator(TheClass)`, and a line below (and in `stoker/__init__.py` to export it).
"""

from ..flow.decorators import parallel, step
from .card import card
from .catch import catch
from .environment import environment
from .monitor import monitor, neuron_monitor
from .project import project
from .resources import resources
from .retry import retry
from .secrets import get_secret, secrets
from .timeout import timeout
from .torchrun import torchrun

__all__ = ["card", "catch", "environment", "get_secret", "monitor", "neuron_monitor", "parallel", "project",
           "resources", "retry", "secrets", "step", "timeout", "torchrun"]
