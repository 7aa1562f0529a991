"""`@catch(var=None, print_exception=True)`: a step that keeps failing does not fail the run.

In the task, once the step's last attempt raises (`ctx.last_attempt`), the exception is stored in `var` as a
CaughtException and the flow goes on to the step's successors without its artifacts; after a success `var` is
None. When the step's attempts are spent and the last did not end in a caught exception (its process died), the
run gives it up to FALLBACK_ATTEMPTS fallback attempts (`fallback_attempts`) that do not run the step: they raise
FailureHandledByCatch, which is stored the same way (as Metaflow). A gang falls back as one: when a node died (its
process killed, its host lost) and the gang's attempts are spent, every node's fallback attempt records the failure
and the join sees each node with `var` set (Metaflow's local gang: its control task catches "Subprocess failed"
and the join sees that one task). Not on a step that splits (foreach, num_parallel, switch).
"""

from __future__ import annotations

import sys
import traceback

from stoker.errors import StokerError
from stoker.flow.decorators import StepCall, StepDecorator, TaskContext, make_step_decorator
from stoker.redact import redact_text

FALLBACK_ATTEMPTS = 3  # Metaflow's NUM_FALLBACK_RETRIES
NOT_CAUGHT_ON = ("foreach", "parallel", "switch")  # step kinds @catch cannot complete


class FailureHandledByCatch(StokerError):
    """What @catch stores when a task's attempts kept dying without an exception of its code (as Metaflow)."""

    def __init__(self, retry_count: int) -> None:
        super().__init__(f"Task execution kept failing over {retry_count} attempts. Your code did not raise an "
                         f"exception. Something in the execution environment caused the failure.")


class CaughtException:
    """What @catch(var=...) stores: the exception's type, message and traceback as text (picklable)."""

    def __init__(self, exc: BaseException) -> None:
        self.type = f"{type(exc).__module__}.{type(exc).__name__}"
        # an artifact: no secret parameter's value in it
        self.message = redact_text(str(exc))
        self.traceback = redact_text("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))

    exception = property(lambda self: self.message)  # Metaflow's MetaflowExceptionWrapper fields
    stacktrace = property(lambda self: self.traceback)

    def __repr__(self) -> str:
        return f"CaughtException({self.type}: {self.message})"

    __str__ = __repr__


class CatchDecorator(StepDecorator):
    name = "catch"
    defaults = {"var": None, "print_exception": True}
    order = 20  # outside @secrets: a fallback attempt fetches none; inside @timeout
    fallback_note = "@catch: a fallback attempt records the failure and the flow goes on"

    def task_decorate(self, ctx: TaskContext, call: StepCall) -> StepCall:
        if ctx.spec.attempt < ctx.spec.max_attempts:
            return call

        def fallback() -> None:  # the step's own attempts are spent: record the failure, do not run the step
            raise FailureHandledByCatch(ctx.spec.attempt)

        return fallback

    def task_post_step(self, ctx: TaskContext) -> None:
        var = self.attributes["var"]
        if var and var not in ctx.flow.__dict__:
            object.__setattr__(ctx.flow, var, None)  # as Metaflow: None when nothing failed

    def task_exception(self, ctx: TaskContext, exc: BaseException) -> bool:
        if not ctx.last_attempt or isinstance(exc, KeyboardInterrupt) or ctx.node.kind in NOT_CAUGHT_ON:
            return False
        var = self.attributes["var"]
        if var:
            object.__setattr__(ctx.flow, var, CaughtException(exc))
        ctx.manifest["catch_var"] = var
        ctx.manifest["next"] = {"steps": list(ctx.node.out_funcs)}
        print(f"@catch: step {ctx.spec.step} failed ({type(exc).__name__}: {redact_text(str(exc))}); the flow "
              f"continues" + (f" with the exception in self.{var}" if var else ""), file=sys.stderr)
        return True

    def fallback_attempts(self, node_kind: str) -> int:
        return 0 if node_kind in NOT_CAUGHT_ON else FALLBACK_ATTEMPTS


catch = make_step_decorator(CatchDecorator)
