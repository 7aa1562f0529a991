"""`python flow.py run|resume --runner-attribute-file PATH`: the flow process tells its Runner which run it is.

As Metaflow's run command does, the file gets one JSON object: `flow_name`, `run_id` and `metadata`
("local@<stoker home>"); stoker adds `db` (the metadata index) and `store` (the blob store URL) so that the
Runner reads the run where this process writes it, whatever its own STOKER_HOME or working directory.
"""

from __future__ import annotations

import json

from stoker.store.paths import default_db_path, default_store_url, home_dir


def runner_attributes(flow_name: str, run_id: str) -> dict[str, str]:
    """What the runner attribute file holds for run `flow_name/run_id` of this process."""
    return {"flow_name": flow_name, "run_id": run_id, "metadata": f"local@{home_dir()}",
            "db": str(default_db_path()), "store": default_store_url()}


def write_runner_attributes(path: str | None, flow_name: str) -> str | None:
    """With a path: choose the new run's id, write the attributes there (a FIFO the Runner reads, or a file) and
    return the id, which the run must then use; without one: None."""
    if not path:
        return None
    from stoker.runtime.driver.launch import new_run_id

    run_id = new_run_id()
    with open(path, "w", encoding="utf-8") as f:
        json.dump(runner_attributes(flow_name, run_id), f)
    return run_id
