"""Secrets never reach model-written code: which names count as secrets, and the config that refuses them.

The executions themselves are checked per backend: the zygote starts from a fixed environment
(``tests/test_sandbox.py::test_attack_read_environment_secrets``), camel's children get a scrubbed copy
of ours (``tests/test_sandbox_camel.py::test_camel_children_never_see_secrets``).
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from strands_slime.sandbox import SandboxConfig
from strands_slime.sandbox.environment import is_secret_name, scrubbed

pytestmark = pytest.mark.unit

SECRETS = [
    "WANDB_API_KEY",
    "WANDB_KEY",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "RAY_AUTH_TOKEN",
    "RAY_AUTH_TOKEN_PATH",
    "RAY_AUTH_MODE",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "OPENAI_API_KEY",
    "PGPASSWORD",
    "SSH_AUTH_SOCK",
    "GITHUB_TOKEN",
    "wandb_api_key",
    "MY_SERVICE_APIKEY",
]
NOT_SECRETS = [
    "PATH",
    "HOME",
    "PWD",
    "LANG",
    "PYTHONPATH",
    "CUDA_VISIBLE_DEVICES",
    "NCCL_IB_HCA",
    "SLIME_HOST_IP",
    "OMP_NUM_THREADS",
    "KEYBOARD_LAYOUT",
    "MONKEY_BUSINESS",
]


@pytest.mark.parametrize("name", SECRETS)
def test_credentials_are_secrets(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", NOT_SECRETS)
def test_ordinary_variables_are_not(name: str) -> None:
    assert not is_secret_name(name)


def test_scrubbed_keeps_everything_else() -> None:
    environment = {"PATH": "/bin", "WANDB_API_KEY": "k", "HOME": "/h", "RAY_AUTH_TOKEN_PATH": "/t"}
    assert scrubbed(environment) == {"PATH": "/bin", "HOME": "/h"}


def test_the_sandbox_config_refuses_to_pass_a_secret_to_the_code() -> None:
    with pytest.raises(ValidationError, match="HF_TOKEN, WANDB_API_KEY would hand a credential"):
        SandboxConfig(env={"WANDB_API_KEY": "k", "HF_TOKEN": "t", "MPLBACKEND": "Agg"})
    assert SandboxConfig(env={"MPLBACKEND": "Agg"}).env == {"MPLBACKEND": "Agg"}
