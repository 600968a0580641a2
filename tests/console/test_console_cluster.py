"""The console's Nodes page and the queue list's node column in chromium against a real
leveret: a single broker lists itself as the one running node (as a single RabbitMQ
node's /api/nodes does) and each queue's node; a user without the monitoring tag is told
why the page is empty; two cluster nodes on a real PostgreSQL, seen from the first: both
running, then the second stopped, and a queue declared on the second shown on it."""

from __future__ import annotations

from collections.abc import Iterator

import pika
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


def test_the_nodes_page_of_a_cluster_shows_each_node_and_its_state(driver, postgres, tmp_path):
    pytest.importorskip("leveret.cluster.node")
    from cluster_nodes import ClusterNode
    from eventually import eventually
    from targets import unique

    name = unique("console").replace("-", "_")
    n1, n2 = (ClusterNode(tmp_path / n, postgres.url, name, n).start() for n in ("n1", "n2"))
    try:
        for node in (n1, n2):  # started together
            node.wait_for("leveret ready")
        n1.http_url = n1.http_url + "/"  # (login() takes a broker with http_url)
        with pika.BlockingConnection(pika.URLParameters(n2.url)) as connection:
            connection.channel().queue_declare("on-n2", durable=True)
        assert eventually(lambda: http(n1, "GET", "/api/queues/%2F/on-n2")[1], 10)["node"] == "n2"
        login(driver, n1)
        driver.get(n1.http_url.rstrip("/") + "/#/nodes")
        wait(driver, lambda d: (cells(d, "#nodes-table", "n2") or [None, None])[1] == "running", 10)
        assert "this node" in cells(driver, "#nodes-table", "n1")[0]
        assert cells(driver, "#nodes-table", "n2")[4] == f"127.0.0.1:{n2.amqp_port}"
        n2.terminate()  # a graceful stop: it leaves, handing its queue to n1
        states = lambda: [n["running"] for n in http(n1, "GET", "/api/nodes")[1]]  # noqa: E731
        assert eventually(lambda: states() == [True, False], 10)
        driver.refresh()
        wait(driver, lambda d: (cells(d, "#nodes-table", "n2") or [None, ""])[1] == "stopped (left)")
        assert text_of(driver, "#nodes-running b") == "1" and text_of(driver, "#nodes-stopped b") == "1"
        driver.get(n1.http_url.rstrip("/") + "/#/queues")
        wait(driver, lambda d: cells(d, "#queues-table", "/") is not None)
        headers = [th.text for th in driver.find_elements(By.CSS_SELECTOR, "#queues-table thead th")]
        rows = driver.find_elements(By.CSS_SELECTOR, "#queues-table tbody tr")
        row = next(r for r in rows if "on-n2" in r.text)
        assert row.find_elements(By.TAG_NAME, "td")[headers.index("node")].text == "n1"  # its owner now
    finally:
        n1.kill()
        n2.kill()
