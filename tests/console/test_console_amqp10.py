"""The console's connection page for an AMQP 1.0 client (in a real browser): its facts,
then its sessions with their windows and their incoming and outgoing links (handle,
name, address, settle mode, credit), as RabbitMQ 4's management UI shows them; an AMQP
0-9-1 connection's page shows its channels instead."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pika
import pytest
from proton import Message
from proton.reactor import Container
from proton.utils import BlockingConnection
from selenium.webdriver.common.by import By
from test_console import http, login, wait

from leveret import BlockingBroker


@pytest.fixture(scope="module")
def broker() -> Iterator[BlockingBroker]:
    with BlockingBroker(amqp_port=0, http_port=0) as broker:
        yield broker


def link_rows(driver, css: str) -> list[list[str]]:
    """The body rows' cell texts of the tables matching ``css``."""
    return [
        [td.text for td in row.find_elements(By.TAG_NAME, "td")]
        for row in driver.find_elements(By.CSS_SELECTOR, f"{css} tbody tr")
    ]


def test_an_amqp10_connection_page_shows_sessions_and_links(driver, broker):
    container = f"console-{uuid.uuid4().hex[:8]}"
    queue = f"cq-{uuid.uuid4().hex[:6]}"
    assert http(broker, "PUT", f"/api/queues/%2F/{queue}", {"durable": True})[0] == 201
    connection = BlockingConnection(
        f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}", container=Container(container_id=container)
    )
    try:
        sender = connection.create_sender(f"/queues/{queue}", name="orders out")
        sender.send(Message(body="one"))
        connection.create_receiver(f"/queues/{queue}", name="orders in", credit=20)
        rows = http(broker, "GET", "/api/connections")[1]
        [row] = [r for r in rows if r["client_properties"].get("container_id") == container]
        login(driver, broker)
        driver.get(broker.http_url.rstrip("/") + "/#/connections")
        wait(driver, lambda d: d.find_elements(By.LINK_TEXT, row["name"]))
        driver.find_element(By.LINK_TEXT, row["name"]).click()
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".amqp-session"))
        assert driver.find_element(By.ID, "sessions-title").text == "Sessions (1)"
        assert "AMQP 1.0" in driver.find_element(By.CSS_SELECTOR, "table.facts").text
        [incoming] = link_rows(driver, "table.incoming-links")
        assert incoming[:4] == ["0", "orders out", f"/queues/{queue}", "mixed"]
        assert incoming[5] == "1"  # delivery-count: one transfer
        [outgoing] = wait(driver, lambda d: [r for r in link_rows(d, "table.outgoing-links") if r[6] == "1"])
        # one delivery sent: credit 20 - 1 (proton's prefetch may add to it)
        assert outgoing[:5] == ["1", "orders in", f"/queues/{queue}", queue, "no"]
        assert int(outgoing[7].replace(",", "")) >= 19
        [windows] = link_rows(driver, "table.session-windows")
        assert windows[0] == "0" and windows[-1] == "1"  # channel 0, one unsettled delivery
    finally:
        connection.close()


def test_an_amqp091_connection_page_shows_channels(driver, broker):
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    try:
        connection.channel()
        port = connection._impl._transport._sock.getsockname()[1]
        [row] = [r for r in http(broker, "GET", "/api/connections")[1] if r["peer_port"] == port]
        login(driver, broker)
        driver.get(broker.http_url.rstrip("/") + f"/#/connections/{row['name']}")
        wait(driver, lambda d: "Channels (1)" in d.find_element(By.ID, "main").text)
        assert not driver.find_elements(By.CSS_SELECTOR, ".amqp-session")
    finally:
        connection.close()
