"""`stoker stacks` through the store, so that it reaches a task wherever it runs (here, a Slurm node, a Batch
container): the command writes a request object for the run, every live task's watchdog (runtime/member/watchdog.py)
sees it at its next look (about a second with a store in a folder, 5 s with an object store) and answers with the
stacks of its processes (itself, torchrun, every rank) in one object per task attempt.

    runs/<flow>/<run>/stacks/request.json              {"nonce", "scope": "" | "STEP" | "STEP/TASK", "at"}
    runs/<flow>/<run>/stacks/<nonce>/<step>.<task>.<attempt>.json
        {"task": "FLOW/RUN/STEP/TASK", "attempt", "text"}
A hung attempt's stacks are kept with the attempt: `runs/<flow>/<run>/<step>/<task>/<attempt>/stacks.txt`.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from stoker.store.manifest import attempt_prefix

REQUEST_TTL_S = 120.0  # a request older than this is not answered (a task started long after it)


def request_name(flow: str, run_id: str) -> str:
    return f"runs/{flow}/{run_id}/stacks/request.json"


def answers_prefix(flow: str, run_id: str, nonce: str) -> str:
    return f"runs/{flow}/{run_id}/stacks/{nonce}/"


def answer_name(flow: str, run_id: str, nonce: str, step: str, task_id: str, attempt: int) -> str:
    return answers_prefix(flow, run_id, nonce) + f"{step}.{task_id}.{int(attempt)}.json"


def hang_stacks_name(flow: str, run_id: str, step: str, task_id: str, attempt: int) -> str:
    """Where a hung attempt's stacks are kept (`stoker logs --stacks`, `stoker show`)."""
    return attempt_prefix(flow, run_id, step, task_id, attempt) + "stacks.txt"


def in_scope(scope: str, step: str, task_id: str) -> bool:
    """Whether a request for `scope` ("", "STEP" or "STEP/TASK") asks this task."""
    if not scope:
        return True
    parts = scope.split("/")
    return parts[0] == step and (len(parts) < 2 or parts[1] == task_id)


def write_request(store: Any, flow: str, run_id: str, scope: str) -> str:
    """Ask the run's live tasks in `scope` for their stacks; the request's nonce."""
    nonce = uuid.uuid4().hex[:12]
    store.write(request_name(flow, run_id), json.dumps({"nonce": nonce, "scope": scope, "at": time.time()}).encode())
    return nonce


def read_answers(store: Any, flow: str, run_id: str, nonce: str, docs: dict[str, dict]) -> dict[str, dict]:
    """Add the answers to request `nonce` not yet in `docs` (object name -> {"task", "attempt", "text"})."""
    for name in store.list(answers_prefix(flow, run_id, nonce)):
        if name not in docs:
            try:
                docs[name] = json.loads(store.read(name))
            except (ValueError, OSError):
                continue
    return docs
