# From Metaflow's documentation, https://docs.metaflow.org/metaflow/managing-flows/runner
# (github.com/Netflix/metaflow-docs docs/metaflow/managing-flows/runner.md at 1d023210; Apache License 2.0). Verbatim below this header.
# ruff: noqa
from metaflow import Runner
with Runner('slowflow.py').run(max_workers=1, tags=['myrun', 'another_tag']) as running:
    print(f'{running.run} has tags {running.run.user_tags}')
