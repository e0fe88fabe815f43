"""An OpenAI-compatible HTTP frontend for models bound to pytriton (``pip install pytriton[openai]``).

``OpenAIFrontend(triton, [ChatModel(...), EmbeddingModel(...)])`` serves ``/v1/chat/completions``,
``/v1/completions``, ``/v1/embeddings`` and ``/v1/models`` (plus ``/health``) on 127.0.0.1 by
default, for callables bound with ``Triton.bind`` as usual. See docs/openai.md.
"""

# For maintainers (kept out of the API reference):
# Unit tests: tests/unit/test_openai_requests.py, tests/unit/test_openai_app.py,
# tests/unit/test_openai_frontend.py; the exported names are pinned in tests/unit/test_public_api.py.

from __future__ import annotations

from pytriton.openai._frontend import OpenAIFrontend
from pytriton.openai._models import ChatModel, EmbeddingModel

__all__ = ["ChatModel", "EmbeddingModel", "OpenAIFrontend"]
