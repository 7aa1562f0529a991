"""A flow with a secret parameter and an environment variable: their values must reach the steps, and
nothing else (see tests/integration/test_secrets.py)."""

import os

from stoker import FlowSpec, Parameter, catch, retry, step


class SecretFlow(FlowSpec):
    token = Parameter("token", secret=True, help="an API token")
    n = Parameter("n", default=2, type=int)

    @step
    def start(self):
        assert self.token == os.environ["EXPECTED_TOKEN"], "the secret parameter did not reach the step"
        self.items = list(range(self.n))
        self.next(self.work, foreach="items")

    @step
    def work(self):
        assert self.token == os.environ["EXPECTED_TOKEN"]
        assert os.environ.get("API_TOKEN") == os.environ["EXPECTED_ENV"], "the --with environment value is missing"
        self.out = self.input * 2
        self.next(self.join)

    @step
    def join(self, inputs):
        assert self.token == os.environ["EXPECTED_TOKEN"]
        print(f"debugging: the token is {self.token}", flush=True)  # a careless print: the kept log shows ***
        print("split across writes: " + self.token[:3], end="", flush=True)
        print(self.token[3:], flush=True)
        self.outs = sorted(i.out for i in inputs)
        self.next(self.leak)

    @catch(var="failure")
    @retry(times=1, minutes_between_retries=0)
    @step
    def leak(self):
        """An error that echoes the secret (as a library's might): attempt 0 fails (its manifest and log hold the
        exception), attempt 1 is caught (the artifact self.failure holds it)."""
        raise ValueError(f"the API refused the token {self.token!r}")
        self.next(self.end)  # unreachable: the graph needs the transition

    @step
    def end(self):
        print("token length", len(self.token))
        assert "***" in self.failure.message and "***" in self.failure.traceback, self.failure


if __name__ == "__main__":
    SecretFlow()
