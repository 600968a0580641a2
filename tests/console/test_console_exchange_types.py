"""The console's exchange form offers the types the broker has, the plugin ones
(x-consistent-hash, x-random, x-local-random, x-modulus-hash) included, as RabbitMQ's
management UI lists /api/overview's exchange_types; adding one works."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select
from test_console import http, login, text_of, wait

from leveret import BlockingBroker


@pytest.fixture(scope="module")
def broker() -> Iterator[BlockingBroker]:
    with BlockingBroker(amqp_port=0, http_port=0) as broker:
        yield broker


def test_the_exchange_form_lists_and_adds_plugin_types(driver, broker):
    login(driver, broker)
    wait(driver, ec.presence_of_element_located((By.ID, "overview")))
    driver.get(broker.http_url.rstrip("/") + "/#/exchanges")
    select = wait(driver, ec.presence_of_element_located((By.CSS_SELECTOR, "select[name=type]")))
    offered = [option.get_attribute("value") for option in Select(select).options]
    assert {"direct", "fanout", "topic", "headers", "x-consistent-hash", "x-random", "x-local-random",
            "x-modulus-hash"} <= set(offered)
    form = select.find_element(By.XPATH, "./ancestor::form")
    form.find_element(By.NAME, "name").send_keys("console-chx")
    Select(select).select_by_value("x-consistent-hash")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait(driver, lambda d: http(broker, "GET", "/api/exchanges/%2F/console-chx")[0] == 200)
    assert http(broker, "GET", "/api/exchanges/%2F/console-chx")[1]["type"] == "x-consistent-hash"
    wait(driver, lambda d: "console-chx" in text_of(d, "body"))
