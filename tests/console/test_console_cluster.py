"""The console's Nodes page and the queue list's node column in chromium against a real
leveret: a single broker lists itself as the one running node (as a single RabbitMQ
node's /api/nodes does) and each queue's node; a user without the monitoring tag is told
why the page is empty. (Two cluster nodes on PostgreSQL: tests/integration/
test_cluster_ops.py checks the same rows through the API from either node.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from test_console import http, login, text_of, wait

from leveret import BlockingBroker


@pytest.fixture(scope="module")
def broker() -> Iterator[BlockingBroker]:
    with BlockingBroker(amqp_port=0, http_port=0) as broker:
        http(broker, "PUT", "/api/users/watcher", {"password": "watcher", "tags": "management"})
        http(broker, "PUT", "/api/permissions/%2F/watcher", {"configure": ".*", "write": ".*", "read": ".*"})
        assert http(broker, "PUT", "/api/queues/%2F/on-a-node", {"durable": True})[0] == 201
        yield broker


def cells(driver, table: str, first: str) -> list[str] | None:
    for row in driver.find_elements(By.CSS_SELECTOR, f"{table} tbody tr"):
        texts = [td.text for td in row.find_elements(By.TAG_NAME, "td")]
        if texts and texts[0].startswith(first):
            return texts
    return None


def test_the_nodes_page_lists_the_node_and_the_queues_their_node(driver, broker):
    login(driver, broker)
    assert driver.find_element(By.ID, "nav-nodes").is_displayed()
    node = http(broker, "GET", "/api/overview")[1]["node"]
    driver.get(broker.http_url.rstrip("/") + "/#/nodes")
    wait(driver, ec.presence_of_element_located((By.ID, "nodes-table")))
    row = cells(driver, "#nodes-table", node)
    assert row is not None and "this node" in row[0]
    assert row[1] == "running" and row[2]  # state, uptime
    assert text_of(driver, "#nodes-running b") == "1" and text_of(driver, "#nodes-stopped b") == "0"
    queue_node = http(broker, "GET", "/api/queues/%2F/on-a-node")[1]["node"]
    driver.get(broker.http_url.rstrip("/") + "/#/queues")
    wait(driver, lambda d: cells(d, "#queues-table", "/") is not None)
    headers = [th.text for th in driver.find_elements(By.CSS_SELECTOR, "#queues-table thead th")]
    row = cells(driver, "#queues-table", "/")
    assert row is not None and row[headers.index("node")] == queue_node


def test_a_user_without_the_monitoring_tag_is_told_why(driver, broker):
    login(driver, broker, "watcher")
    assert not driver.find_element(By.ID, "nav-nodes").is_displayed()
    driver.get(broker.http_url.rstrip("/") + "/#/nodes")
    wait(driver, lambda d: "Not monitor user" in text_of(d, "#main"))
