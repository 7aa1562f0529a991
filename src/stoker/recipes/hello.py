"""The smallest flow: three steps, one artifact.

    python examples/hello.py run
"""

from stoker import FlowSpec, step


class HelloFlow(FlowSpec):
    """Say hello, pass an artifact from step to step."""

    @step
    def start(self):
        self.greeting = "hello"
        print("starting")
        self.next(self.hello)

    @step
    def hello(self):
        self.message = f"{self.greeting}, world"
        print(self.message)
        self.next(self.end)

    @step
    def end(self):
        print("done:", self.message)


if __name__ == "__main__":
    HelloFlow()
