# From Metaflow's documentation, https://docs.metaflow.org/scaling/failures
# (github.com/Netflix/metaflow-docs docs/scaling/failures.md at 1d023210; Apache License 2.0). Verbatim below this header.
# ruff: noqa
from metaflow import step, FlowSpec, Parameter, exit_hook, Run

def success_print():
    print("✅ Flow completed successfully!")

def failure_print(run):
    if run:
        print(f"💥 Run {run.pathspec} failed. Failed tasks:")
        for step in run:
            for task in step:
                if not task.successful:
                    print(f"  →  {task.pathspec}")
    else:
        print(f"💥 Run failed during initialization")

@exit_hook(on_error=[failure_print], on_success=[success_print])
class ExitHookFlow(FlowSpec):
    should_fail = Parameter(name="should-fail", default=False)

    @step
    def start(self):
        print("Starting 👋")
        print("Should fail?", self.should_fail)
        if self.should_fail:
            raise Exception("failing as expected")
        self.next(self.end)

    @step
    def end(self):
        print("Done! 🏁")

if __name__ == "__main__":
    ExitHookFlow()
