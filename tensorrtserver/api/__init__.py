"""``tensorrtserver.api``: the legacy client API (see ``pytriton.client.legacy``)."""

from pytriton.client.legacy import *  # noqa: F403 - the alias re-exports the whole curated API
from pytriton.client.legacy import __all__  # noqa: F401
