"""A task's and a node's process: the node agent, the task entrypoint, the hand-over of a forked member."""
