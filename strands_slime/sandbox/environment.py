"""What model-written code may see of the environment: never a secret.

On a training node the rollout process's environment holds the W&B key, Ray's auth token and
whatever cloud credentials the node has; code the model writes prints ``os.environ`` as readily as
anything else, and its output lands in the rollout, the logs and the training data. The zygote
backend starts every execution from a fixed environment plus ``sandbox.env`` (which may not name a
secret); the camel backend runs code with a copy of the rollout process's environment, filtered here.
Names are judged by their words, so new credentials (``FOO_API_KEY``, ``BAR_TOKEN``) are caught too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["is_secret_name", "scrubbed"]

_SECRET_SUBSTRINGS = ("TOKEN", "SECRET", "PASSW", "PASSPHRASE", "CREDENTIAL", "PRIVATE")
_SECRET_WORDS = frozenset({"KEY", "KEYS", "APIKEY", "AUTH", "COOKIE", "SESSION", "CERT", "NETRC"})


def is_secret_name(name: str) -> bool:
    """Whether an environment variable's name says it holds (or points at) a credential.

    ``WANDB_API_KEY``, ``WANDB_KEY``, ``HF_TOKEN``, ``RAY_AUTH_TOKEN_PATH``, ``AWS_SECRET_ACCESS_KEY``,
    ``PGPASSWORD``, ``SSH_AUTH_SOCK``, ``GOOGLE_APPLICATION_CREDENTIALS``: yes. ``PATH``, ``HOME``,
    ``PWD``, ``CUDA_VISIBLE_DEVICES``: no.
    """
    upper = name.upper()
    if any(part in upper for part in _SECRET_SUBSTRINGS):
        return True
    return any(word in _SECRET_WORDS for word in re.split(r"[^A-Z0-9]+", upper))


def scrubbed(environment: Mapping[str, str]) -> dict[str, str]:
    """``environment`` without the variables :func:`is_secret_name` flags."""
    return {name: value for name, value in environment.items() if not is_secret_name(name)}
