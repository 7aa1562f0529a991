"""What every process of a task (its own, torchrun's, each rank's) loads at start-up when `$STOKER_STACKS_DIR` is set:
see stackhook.py. The folder is put on the children's PYTHONPATH by the task (runtime/member/watchdog.py)."""
