# From Metaflow's documentation, https://docs.metaflow.org/metaflow/composing-flows/custom-decorators
# (github.com/Netflix/metaflow-docs docs/metaflow/composing-flows/custom-decorators.md at 1d023210; Apache License 2.0). Verbatim below this header.
# ruff: noqa
import time
from metaflow import user_step_decorator, current

@user_step_decorator
def my_profile(step_name, flow, inputs=None, attributes=None):
    start = time.time()
    yield
    duration = 1000 * (time.time() - start)
    print(f"⏰ Task [{current.pathspec}] completed in {duration:.1f}ms")
