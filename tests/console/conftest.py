"""One headless chromium for the whole test session (see browser.py)."""

from __future__ import annotations

import pytest
from browser import missing, start


@pytest.fixture(scope="session")
def driver():
    why = missing()
    if why is not None:
        pytest.skip(why)
    browser = start()
    yield browser
    browser.quit()
