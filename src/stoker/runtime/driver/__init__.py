"""The run's process: launch, the scheduler and its queue, transitions, the jobs it submits, its output."""
