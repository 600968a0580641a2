"""The console's Federation page in chromium against two real leverets: a downstream
federating ``fed.x`` from a working upstream and from a closed port shows one running
and one failing link with its error text, counts them by state, and restarts a link
(checked through the API: it comes back on a new local connection); a user without
the monitoring tag is told why the page is empty, as RabbitMQ's API refuses them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from brokers import free_port as closed_port  # a port nothing listens on
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from test_console import http, login, text_of, wait

from leveret import BlockingBroker

pytest.importorskip("leveret.federation.exchange_link")  # the links shown are exchange links
WAIT = 20  # seconds: a link connects, a failing one reports its error


@pytest.fixture(scope="module")
def broker() -> Iterator[BlockingBroker]:
    """The downstream (its upstream runs beside it for the module)."""
    with BlockingBroker(amqp_port=0, http_port=0) as up, BlockingBroker(amqp_port=0, http_port=0) as down:
        upstream = {"uri": f"amqp://guest:guest@127.0.0.1:{up.amqp_port}", "reconnect-delay": 1}
        refused = {"uri": f"amqp://guest:guest@127.0.0.1:{closed_port()}", "reconnect-delay": 1}
        parameters = "/api/parameters/federation-upstream/%2F"
        assert http(up, "PUT", "/api/exchanges/%2F/fed.x", {"type": "topic"})[0] == 201
        assert http(down, "PUT", "/api/exchanges/%2F/fed.x", {"type": "topic"})[0] == 201
        assert http(down, "PUT", f"{parameters}/good", {"value": upstream})[0] == 201
        assert http(down, "PUT", f"{parameters}/refused", {"value": refused})[0] == 201
        every = {"federation-upstream-set": "all"}
        policy = {"pattern": "^fed\\.", "definition": every, "apply-to": "exchanges"}
        assert http(down, "PUT", "/api/policies/%2F/federate", policy)[0] == 201
        http(down, "PUT", "/api/users/watcher", {"password": "watcher", "tags": "management"})
        http(down, "PUT", "/api/permissions/%2F/watcher", {"configure": ".*", "write": ".*", "read": ".*"})
        yield down


def row_of(driver, upstream: str):
    for row in driver.find_elements(By.CSS_SELECTOR, "#federation-links tbody tr"):
        cells = row.find_elements(By.TAG_NAME, "td")
        if cells and cells[0].text == upstream:
            return cells
    return None


def test_the_federation_page_shows_link_states_and_restarts_a_link(driver, broker):
    login(driver, broker)
    assert driver.find_element(By.ID, "nav-federation").is_displayed()
    driver.get(broker.http_url.rstrip("/") + "/#/federation")
    wait(driver, ec.presence_of_element_located((By.ID, "federation-links")))
    # refreshed every 5 s: the running link and the failing one's error appear
    wait(driver, lambda d: (row_of(d, "good") or [None] * 7)[6].text == "running", WAIT)
    wait(driver, lambda d: (row_of(d, "refused") or [None] * 7)[6].text == "error", WAIT)
    good, refused = row_of(driver, "good"), row_of(driver, "refused")
    assert [c.text for c in good[1:5]] == ["/", "exchange", "fed.x", "fed.x"]
    assert "refused" in refused[7].text.lower()  # the error text
    assert good[7].text and "refused" not in good[7].text.lower()  # the local connection
    assert text_of(driver, "#links-running b") == "1" and text_of(driver, "#links-error b") == "1"
    before = {r["upstream"]: r for r in http(broker, "GET", "/api/federation-links")[1]}["good"]
    good[-1].find_element(By.CSS_SELECTOR, "button.restart").click()
    wait(driver, lambda d: f"Restarting link {before['id']}" in text_of(d, "#flash"))

    def restarted(_driver) -> bool:
        row = {r["upstream"]: r for r in http(broker, "GET", "/api/federation-links")[1]}["good"]
        return row["status"] == "running" and row["local_connection"] != before["local_connection"]

    wait(driver, restarted, WAIT)


def test_a_user_without_the_monitoring_tag_is_told_why(driver, broker):
    login(driver, broker, "watcher")
    assert not driver.find_element(By.ID, "nav-federation").is_displayed()
    driver.get(broker.http_url.rstrip("/") + "/#/federation")
    wait(driver, lambda d: "Not monitor user" in text_of(d, "#main"))
    assert text_of(driver, "#who").startswith("watcher (")  # still logged in
