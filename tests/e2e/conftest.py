import pytest

from pytriton.server.distribution import find_server
from tests.e2e._kinds import KINDS


def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session", autouse=True)
def _server_installed():
    # The e2e suite needs the real server: fail loudly (never skip) if it is missing.
    find_server()


@pytest.fixture(params=KINDS)
def kind(request):
    """The instance kind a test runs on: ``thread`` or ``backend`` (tests/e2e/_kinds.py)."""
    return request.param
