"""User step decorators in the task (`UserStepDecorator`, `@user_step_decorator`; flow/user_decorators.py).

As Metaflow 2.19 (metaflow/task.py `_exec_step_function`): the step's user decorators wrap the step as its
other decorators left it, the topmost outermost. Each `pre_step` runs in turn until one returns a callable (run
instead of what it wraps) or sets `skip_step`; then the step (or the callable) runs; then the `post_step`s of
those that ran, innermost first, each seeing the exception so far (returning None swallows it). When the step
was skipped, replaced, or its exception swallowed, `self.next` is called for it: with the given arguments, or as
the step's own `self.next` says.
"""

from __future__ import annotations

from typing import Any

from stoker.errors import StokerError
from stoker.features.hooks import every_task
from stoker.flow.decorators import StepCall, StepDecorator, TaskContext


class UserWrappers(StepDecorator):
    """Runs the user step decorators of every step that has some (each task has this hook)."""

    name = "user_step_decorators"
    order = 10_000  # outermost: around what every other decorator made of the step

    def task_decorate(self, ctx: TaskContext, call: StepCall) -> StepCall:
        wrappers = list(getattr(ctx.func, "wrappers", None) or ())
        if not wrappers:
            return call
        return lambda: run_wrapped(ctx, wrappers, call)


def run_wrapped(ctx: TaskContext, wrappers: list[Any], call: StepCall) -> None:
    flow, step_name, inputs = ctx.flow, ctx.spec.step, ctx.inputs
    stack, replacement, fake_next = [], None, None
    for w in reversed(wrappers):
        w.external_init()
        replacement = w.pre_step(step_name, flow, inputs)
        stack.append(w)
        if w.skip_step:
            fake_next = w.skip_step
            break
        if replacement:
            break
    raised: BaseException | None = None
    had_raised = False
    try:
        if not fake_next:
            if replacement:
                fake_next = (replacement(flow) if inputs is None else replacement(flow, inputs)) or None
            else:
                call()
    except Exception as ex:  # noqa: BLE001 - the post_steps decide what becomes of it
        raised, had_raised = ex, True
    for w in reversed(stack):
        try:
            r = w.post_step(step_name, flow, raised)
        except Exception as ex:  # noqa: BLE001
            r = ex
        if r is None:
            raised = None
        elif isinstance(r, BaseException):
            raised = r
        elif isinstance(r, tuple) and len(r) == 2:
            raised, fake_next = r
        elif isinstance(r, tuple):
            raise r[2]
        else:
            raise StokerError(f"Invalid return value from a UserStepDecorator. Expected an exception or an "
                              f"exception and arguments for self.next, got: {r!r}")
    if raised is not None:
        raise raised
    if (fake_next is not None and fake_next is not False) or had_raised:
        _fake_next(ctx, fake_next, had_raised)


def _fake_next(ctx: TaskContext, args: Any, had_raised: bool) -> None:
    """Call `self.next` for a step whose own code did not (skipped, replaced, or its exception swallowed)."""
    node, flow = ctx.node, ctx.flow
    if not node.out_funcs:
        return
    steps = [getattr(flow, f) for f in node.out_funcs]
    flow.__dict__["_transition"] = None
    if isinstance(args, dict) and args:
        flow.next(*steps, **args)
    elif args is True or args == {} or had_raised:
        if node.kind == "parallel":
            raise StokerError("Skipping a parallel foreach step without providing the arguments to the self.next "
                              "call is not supported.")
        if node.kind == "switch":
            raise StokerError("Skipping a switch step without providing the arguments to the self.next call is "
                              "not supported.")
        flow.next(*steps, **({"foreach": node.foreach_var} if node.kind == "foreach" else {}))
    else:
        raise StokerError(f"Invalid value passed to self.next; expected bool or a dictionary; got: {args!r}")


every_task(UserWrappers())
