"""Secrets never reach model-written code: which names count as secrets, and the config that refuses them.

The executions themselves are checked per backend: the zygote starts from a fixed environment
(``tests/test_sandbox.py::test_attack_read_environment_secrets``), camel's children get a scrubbed copy
of ours (``tests/test_sandbox_camel.py::test_camel_children_never_see_secrets``).
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from strands_slime.sandbox import SandboxConfig
from strands_slime.sandbox.environment import has_url_credentials, is_secret_name, scrubbed, secrets_in_reach

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
    "GITHUB_PAT",
    "GITLAB_PAT",
    "azure_devops_pat",
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
    "PATCH_LEVEL",
    "MANPATH",
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


@pytest.mark.parametrize(
    "value",
    [
        "postgres://trainer:hunter2@db.internal:5432/runs",
        "http://user:pass@proxy.corp:3128",
        "https://ghp_abc123@github.com/org/repo.git",
        "redis://:s3cret@cache:6379/0",
    ],
)
def test_urls_with_credentials_are_secrets_whatever_their_name(value: str) -> None:
    assert has_url_credentials(value)
    assert scrubbed({"DATABASE_URL": value, "HTTPS_PROXY": value, "PATH": "/bin"}) == {"PATH": "/bin"}


@pytest.mark.parametrize("value", ["http://proxy.corp:3128", "https://pypi.org/simple", "/usr/bin", "a@b.c"])
def test_urls_without_credentials_pass(value: str) -> None:
    assert not has_url_credentials(value)


def test_secrets_in_reach_names_variables_and_credential_files_never_values(tmp_path) -> None:
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".netrc").write_text("machine api.wandb.ai login user password wandb-secret\n")
    token = tmp_path / "ray-token"
    token.write_text("ray-secret")
    environment = {
        "HOME": str(home),
        "PATH": "/bin",
        "WANDB_API_KEY": "wandb-secret",
        "DATABASE_URL": "postgres://u:db-secret@db/x",
        "RAY_AUTH_TOKEN_PATH": str(token),
        "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt",
        "EMPTY_TOKEN": "",
    }
    found = secrets_in_reach(environment)
    assert found == [
        "DATABASE_URL",
        "RAY_AUTH_TOKEN_PATH",
        "WANDB_API_KEY",
        str(home / ".netrc"),
        str(token),
    ]
    assert not any(value in " ".join(found) for value in ("wandb-secret", "db-secret", "ray-secret"))
    assert secrets_in_reach({"HOME": str(tmp_path / "empty"), "PATH": "/bin"}) == []
