"""`stoker infra plan | apply | destroy | status`: the AWS resources a Batch run needs, from one TOML file.

    config.py    the TOML as a validated dataclass (InfraConfig), `stoker infra init`'s template
    spec.py      desired resources as request payloads, pure: launch template + user data, compute environment
    policies.py  IAM documents (least privilege) and check_least_privilege
    base.py      injected clients, the context, AWS calls with error messages, waits, the Resource interface
    storage.py   S3 bucket, ECR repository
    secret.py    the Secrets Manager secret holding the store's signing key (for Batch nodes and teammates)
    iam.py       instance role + profile, job role, Batch's service-linked role
    network.py   security group, placement group, launch template
    compute.py   compute environment, job queue
    plan.py      read AWS, compare, Plan (changes nothing)
    apply.py     apply, destroy, status
    state.py     $STOKER_HOME/infra/<name>.json and load_outputs() for the Batch backend
"""

from __future__ import annotations

from stoker.backends.aws.infra.apply import Result, apply, destroy, status
from stoker.backends.aws.infra.base import Clients
from stoker.backends.aws.infra.config import DEFAULT_CONFIG, InfraConfig, load_config
from stoker.backends.aws.infra.plan import Plan, plan
from stoker.backends.aws.infra.policies import check_least_privilege, instance_role_policies, job_role_policy
from stoker.backends.aws.infra.state import load_outputs, state_path

__all__ = ["DEFAULT_CONFIG", "Clients", "InfraConfig", "Plan", "Result", "apply", "check_least_privilege",
           "destroy", "instance_role_policies", "job_role_policy", "load_config", "load_outputs", "plan",
           "state_path", "status"]
