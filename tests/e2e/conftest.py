import pytest

from pytriton.server.distribution import find_server


def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session", autouse=True)
def _server_installed():
    # The e2e suite needs the real server: fail loudly (never skip) if it is missing.
    find_server()
