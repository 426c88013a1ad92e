"""What model-written code may see of the environment: never a secret.

Code the model writes prints ``os.environ`` as readily as anything else, and its output lands in the
rollout, the logs and the training data. Names are judged by their words, so new credentials
(``FOO_API_KEY``, ``GITLAB_PAT``) are caught too, and values by their form (a URL with a password is a
credential whatever its name). Filtering a copy is not isolation: :func:`secrets_in_reach` lists what
unisolated code could still read, so a backend without isolation can refuse to run next to it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

__all__ = ["has_url_credentials", "is_secret", "is_secret_name", "scrubbed", "secrets_in_reach"]

_SECRET_SUBSTRINGS = ("TOKEN", "SECRET", "PASSW", "PASSPHRASE", "CREDENTIAL", "PRIVATE")
_SECRET_WORDS = frozenset({"KEY", "KEYS", "APIKEY", "AUTH", "COOKIE", "SESSION", "CERT", "NETRC", "PAT"})
# scheme://user:password@host (or scheme://token@host): credentials inside a URL.
_URL_CREDENTIALS = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s@:]*(?::[^/\s@]*)?@")
CREDENTIAL_FILES = (
    ".netrc",
    ".git-credentials",
    ".aws/credentials",
    ".config/gcloud/application_default_credentials.json",
    ".cache/huggingface/token",
    ".huggingface/token",
    ".ray/auth_token",
    ".docker/config.json",
    ".pgpass",
)
"""Files under the home directory that hold credentials (W&B keeps its key in ``.netrc``)."""
# Public CA bundles: scrubbed with the rest of the *CERT* names, but no credential to keep out of reach.
_PUBLIC_CA = re.compile(r"(?:^|_)(?:SSL_CERT_FILE|SSL_CERT_DIR|PIP_CERT|CA_BUNDLE|CA_CERTS?)$")


def is_secret_name(name: str) -> bool:
    """Whether an environment variable's name says it holds (or points at) a credential.

    ``WANDB_API_KEY``, ``WANDB_KEY``, ``HF_TOKEN``, ``RAY_AUTH_TOKEN_PATH``, ``AWS_SECRET_ACCESS_KEY``,
    ``PGPASSWORD``, ``SSH_AUTH_SOCK``, ``GOOGLE_APPLICATION_CREDENTIALS``, ``GITHUB_PAT``: yes. ``PATH``, ``HOME``,
    ``PWD``, ``CUDA_VISIBLE_DEVICES``: no.
    """
    upper = name.upper()
    if any(part in upper for part in _SECRET_SUBSTRINGS):
        return True
    return any(word in _SECRET_WORDS for word in re.split(r"[^A-Z0-9]+", upper))


def has_url_credentials(value: str) -> bool:
    """Whether ``value`` holds a URL with credentials in it (``postgres://user:pw@db/x``)."""
    return bool(_URL_CREDENTIALS.search(value))


def is_secret(name: str, value: str) -> bool:
    """Whether a variable holds a credential, by its name or its value."""
    return is_secret_name(name) or has_url_credentials(value)


def scrubbed(environment: Mapping[str, str]) -> dict[str, str]:
    """``environment`` without the variables that hold a credential (:func:`is_secret`)."""
    return {name: value for name, value in environment.items() if not is_secret(name, value)}


def secrets_in_reach(environment: Mapping[str, str] | None = None, home: Path | None = None) -> list[str]:
    """What unisolated code running as this user could read: the names of secret variables in
    ``environment`` (``os.environ``; readable through ``/proc/<ppid>/environ``) and the credential
    files that exist (``~/.netrc``, Ray's token file, ...). Names and paths only, never values."""
    environment = os.environ if environment is None else environment
    found = sorted(
        name
        for name, value in environment.items()
        if value
        and is_secret(name, value)
        and not (_PUBLIC_CA.search(name.upper()) and not has_url_credentials(value))
    )
    home = Path(environment.get("HOME") or Path.home()) if home is None else home
    files = [home / relative for relative in CREDENTIAL_FILES]
    token_path = environment.get("RAY_AUTH_TOKEN_PATH")
    if token_path:
        files.append(Path(token_path))
    found += [str(path) for path in files if os.access(path, os.R_OK) and path.is_file()]
    return found
