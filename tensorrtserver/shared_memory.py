"""``tensorrtserver.shared_memory``: system shared-memory helpers (see ``pytriton.client.legacy.shared_memory``)."""

from pytriton.client.legacy.shared_memory import *  # noqa: F403 - the alias re-exports the helper module
from pytriton.client.legacy.shared_memory import __all__  # noqa: F401
