# From Metaflow's documentation, https://docs.metaflow.org/metaflow/managing-flows/runner
# (github.com/Netflix/metaflow-docs docs/metaflow/managing-flows/runner.md at 1d023210; Apache License 2.0). Verbatim below this header.
# ruff: noqa
from metaflow import Runner

SECONDS = 5

with Runner('slowflow.py', show_output=False).run(seconds=SECONDS) as running:
    if running.status == 'failed':
        print(f'❌ {running.run} failed:')
    elif running.status == 'successful':
        print(f'✅ {running.run} succeeded:')
    print(f'-- stdout --\n{running.stdout}')
    print(f'-- stderr --\n{running.stderr}')

    print(f'⏰ The flow waited for {running.run.data.secs} seconds')
