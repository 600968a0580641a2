"""Screenshots of the web console for docs/management.md: starts a leveret with some traffic and
dead letters, logs in with Debian's chromium (tests/console/browser.py) and saves
docs/console-*.png. Usage: python scripts/screenshots.py"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pika

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "console"))

from browser import missing, start  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as ec  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from leveret import BlockingBroker  # noqa: E402

DOCS = ROOT / "docs"


def demo_data(url: str) -> None:
    """Orders and payments that dead-letter into ``dlq`` for a few reasons."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.exchange_declare("dlx", "fanout")
    channel.queue_declare("dlq", durable=True)
    channel.queue_bind("dlq", "dlx")
    channel.queue_declare(
        "orders", durable=True, arguments={"x-dead-letter-exchange": "dlx", "x-max-length": 40}
    )
    channel.queue_declare("payments", durable=True, arguments={"x-dead-letter-exchange": "dlx"})
    channel.queue_declare("emails", durable=True)
    for n in range(60):
        channel.basic_publish(
            "",
            "orders",
            f'{{"order": {n}, "sku": "sku-{n % 7}", "amount": {n * 3.5}}}'.encode(),
            pika.BasicProperties(delivery_mode=2, headers={"tenant": ["acme", "globex"][n % 2]}),
        )
    for n in range(12):
        channel.basic_publish("", "payments", f"payment {n}".encode(), pika.BasicProperties(delivery_mode=2))
        method, _, _ = channel.basic_get("payments")
        channel.basic_reject(method.delivery_tag, requeue=False)
    for n in range(8):
        channel.basic_publish("", "emails", f"mail {n}".encode(), pika.BasicProperties(expiration="600000"))
    connection.close()


def traffic(url: str, stop: threading.Event) -> None:
    """A steady trickle so the overview's rates are not flat."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.queue_declare("work")
    while not stop.is_set():
        for _ in range(20):
            channel.basic_publish("", "work", b"job")
        for _ in range(18):
            method, _, _ = channel.basic_get("work")
            if method is not None:
                channel.basic_ack(method.delivery_tag)
        time.sleep(0.1)
    connection.close()


def main() -> None:
    why = missing()
    if why:
        sys.exit(why)
    DOCS.mkdir(exist_ok=True)
    with BlockingBroker(amqp_port=0, http_port=0, collect_statistics_interval=1000) as broker:
        demo_data(broker.amqp_url)
        stop = threading.Event()
        worker = threading.Thread(target=traffic, args=(broker.amqp_url, stop))
        worker.start()
        driver = start(1280, 800)
        try:
            base = broker.http_url.rstrip("/")
            driver.get(base + "/#/")
            form = WebDriverWait(driver, 10).until(ec.presence_of_element_located((By.ID, "login-form")))
            form.find_element(By.NAME, "username").send_keys("guest")
            form.find_element(By.NAME, "password").send_keys("guest")
            form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
            WebDriverWait(driver, 10).until(ec.presence_of_element_located((By.ID, "overview")))
            time.sleep(12)  # some samples for the charts
            driver.get(base + "/#/")
            time.sleep(1.5)
            driver.save_screenshot(str(DOCS / "console-overview.png"))
            for page, name in (("#/queues", "queues"), ("#/dead-letters", "dead-letters")):
                driver.get(f"{base}/{page}")
                time.sleep(1.5)
                driver.save_screenshot(str(DOCS / f"console-{name}.png"))
            driver.get(f"{base}/#/dead-letters/%2F/dlq")
            WebDriverWait(driver, 10).until(ec.presence_of_element_located((By.ID, "dlq-table")))
            form = driver.find_element(By.ID, "filter-form")
            form.find_element(By.NAME, "reason").send_keys("maxlen")
            form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
            time.sleep(1)
            driver.find_element(By.CSS_SELECTOR, "#dlq-table details").click()
            time.sleep(0.5)
            driver.save_screenshot(str(DOCS / "console-dead-letter-messages.png"))
        finally:
            driver.quit()
            stop.set()
            worker.join()
    print("saved", *sorted(p.name for p in DOCS.glob("console-*.png")))


if __name__ == "__main__":
    main()
