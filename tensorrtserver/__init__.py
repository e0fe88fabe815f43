"""Migration alias: the legacy ``tensorrtserver`` client package, served by ``pytriton.client.legacy``.

Old code that imports ``tensorrtserver.api`` and ``tensorrtserver.shared_memory`` runs unchanged
against current Triton servers. New code should use ``pytriton.client`` or ``tritonclient``.
"""
