"""@secrets from AWS Secrets Manager (JSON and plain string secrets) and an inline source."""

import os

from metaflow import FlowSpec, secrets, step

NAMES = ("DB_USER", "db_password", "API_KEY", "INLINE_TOKEN")


class SecretsFlow(FlowSpec):
    """Secrets are environment variables of the decorated step's task only."""

    @secrets(sources=["aws-secrets-manager.compat/db-creds",
                      {"type": "aws-secrets-manager", "id": "compat-api-key",
                       "options": {"json": False, "env_var_name": "API_KEY"}},
                      {"type": "inline", "id": "inline-one",
                       "options": {"env_vars": {"INLINE_TOKEN": "inl-7c2d-val"}}}])
    @step
    def start(self):
        self.lengths = {k: len(os.environ.get(k, "")) for k in NAMES}
        self.user = os.environ.get("DB_USER")
        print("db password:", os.environ.get("db_password"))
        self.next(self.end)

    @step
    def end(self):
        self.leaked = [k for k in NAMES if k in os.environ]


if __name__ == "__main__":
    SecretsFlow()
