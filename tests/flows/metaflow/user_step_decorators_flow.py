"""Metaflow 2.19's custom step decorators: the generator form (`@user_step_decorator`) and the class form
(`UserStepDecorator`): code around a step, its arguments, a skipped step, a replaced step, a swallowed exception."""

import time

from metaflow import USER_SKIP_STEP, FlowSpec, UserStepDecorator, step, user_step_decorator


@user_step_decorator
def timing(step_name, flow, inputs):
    start = time.time()
    yield
    flow.timed = {"step": step_name, "elapsed_ok": time.time() - start >= 0, "inputs": inputs is not None}


@user_step_decorator
def labelled(step_name, flow, inputs, attributes):
    flow.before = f"before {step_name} {sorted(attributes.items())}"
    yield
    flow.after = "after {} saw {}".format(step_name, getattr(flow, "made", None))


@user_step_decorator
def skip_me(step_name, flow, inputs):
    yield USER_SKIP_STEP


@user_step_decorator
def swallow(step_name, flow, inputs):
    try:
        yield
    except ValueError as e:
        flow.swallowed = str(e)


@user_step_decorator
def replace(step_name, flow, inputs):
    def instead(self):
        self.replaced_in = step_name
        return True  # then self.next as the replaced step says

    yield instead


class Counted(UserStepDecorator):
    def init(self, *args, **kwargs):
        self.label = kwargs.get("label", "none")

    def pre_step(self, step_name, flow, inputs=None):
        flow.class_pre = f"{self.label}:{step_name}:{None if inputs is None else len(list(inputs))}"

    def post_step(self, step_name, flow, exception=None):
        flow.class_post = "ok" if exception is None else type(exception).__name__
        return exception, None


class UserStepDecoratorsFlow(FlowSpec):
    @timing
    @labelled(label="first", n=2)
    @step
    def start(self):
        self.made = "start-made"
        self.next(self.skipped)

    @skip_me
    @step
    def skipped(self):
        self.never = True
        self.next(self.failing)

    @swallow
    @step
    def failing(self):
        raise ValueError("swallowed here")
        self.next(self.replaced)

    @replace
    @step
    def replaced(self):
        self.never_either = True
        self.next(self.a, self.b)

    @Counted(label="branch")
    @step
    def a(self):
        self.x = 1
        self.next(self.join)

    @Counted
    @step
    def b(self):
        self.x = 2
        self.next(self.join)

    @timing
    @Counted(label="join")
    @step
    def join(self, inputs):
        self.xs = sorted(i.x for i in inputs)
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    UserStepDecoratorsFlow()
