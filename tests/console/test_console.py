"""The web console in a real browser (Debian's chromium, driven by Selenium) against a
real leveret: log in, read the overview, work a queue, the admin pages by tag, and the
dead-letter flow (browse a DLQ, filter, count, retry to origin, watch the count drop, read
the audit log). CSRF protection is checked with plain HTTP requests too."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.cookiejar import CookieJar

import pika
import pytest
from dead_letters import dead_letters
from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from leveret import BlockingBroker

WAIT = 10  # seconds a page may take to show something


@pytest.fixture(scope="module")
def broker(tmp_path_factory) -> Iterator[BlockingBroker]:
    data = tmp_path_factory.mktemp("console") / "data"
    with BlockingBroker(
        amqp_port=0, http_port=0, data_dir=str(data), collect_statistics_interval=200
    ) as broker:
        http(broker, "PUT", "/api/users/watcher", {"password": "watcher", "tags": "management"})
        http(broker, "PUT", "/api/permissions/%2F/watcher", {"configure": ".*", "write": ".*", "read": ".*"})
        yield broker


def http(broker, method: str, path: str, body: dict | None = None, user: str = "guest") -> tuple[int, object]:
    request = urllib.request.Request(
        broker.http_url.rstrip("/") + path, None if body is None else json.dumps(body).encode(), method=method
    )
    request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{user}".encode()).decode())
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def wait(driver, condition, timeout: float = WAIT):
    # a page re-rendered between finding an element and reading it: look again
    stale = (StaleElementReferenceException,)
    return WebDriverWait(driver, timeout, ignored_exceptions=stale).until(condition)


def text_of(driver, css: str) -> str:
    return driver.find_element(By.CSS_SELECTOR, css).text


def login(driver, broker, user: str = "guest", password: str | None = None) -> None:
    """Log in as ``user`` (password: the name, guest's "guest") in a fresh page; a
    wrong ``password`` leaves the login form showing its error."""
    password = password if password is not None else user
    _submit_login(driver, broker, user, password)
    if password == user:
        wait(driver, lambda d: text_of(d, "#who").startswith(f"{user} ("))


def _submit_login(driver, broker, user: str, password: str) -> None:
    driver.get(broker.http_url.rstrip("/") + "/console/style.css")  # the broker's origin, not the app
    driver.delete_all_cookies()
    driver.get(broker.http_url.rstrip("/") + "/#/")
    form = wait(driver, ec.presence_of_element_located((By.ID, "login-form")))
    form.find_element(By.NAME, "username").send_keys(user)
    form.find_element(By.NAME, "password").send_keys(password)
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()


def accept_confirm(driver) -> None:
    wait(driver, ec.alert_is_present())
    driver.switch_to.alert.accept()


def test_login_is_refused_with_a_wrong_password_then_shows_the_overview(driver, broker):
    login(driver, broker, "guest", password="wrong")
    error = wait(driver, ec.visibility_of_element_located((By.ID, "login-error")))
    wait(driver, lambda d: "Login failed" in error.text)
    login(driver, broker)
    wait(driver, ec.presence_of_element_located((By.ID, "overview")))
    assert "guest" in text_of(driver, "#who") and "administrator" in text_of(driver, "#who")
    assert driver.find_element(By.ID, "nav-admin").is_displayed()


def test_the_overview_shows_the_broker_totals(driver, broker):
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    channel = connection.channel()
    channel.queue_declare("overview-q")
    for _ in range(7):
        channel.basic_publish("", "overview-q", b"x")
    login(driver, broker)
    wait(driver, lambda d: text_of(d, "#total-ready b") == "7")
    assert text_of(driver, "#total-queues b") == "1"
    assert text_of(driver, "#total-connections b") == "1"
    connection.close()
    channel = None
    http(broker, "DELETE", "/api/queues/%2F/overview-q")


def test_a_queue_page_publishes_gets_and_purges(driver, broker):
    http(broker, "PUT", "/api/queues/%2F/work", {"durable": True})
    login(driver, broker)
    wait(driver, ec.presence_of_element_located((By.ID, "overview")))
    driver.get(broker.http_url.rstrip("/") + "/#/queues/%2F/work")
    publish = wait(driver, ec.presence_of_element_located((By.ID, "publish-form")))
    for body in ("first", "second"):
        publish.find_element(By.NAME, "payload").send_keys(body)
        publish.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait(driver, lambda d: "published" in text_of(d, "#flash"))
        driver.execute_script("document.getElementById('flash').replaceChildren()")
    assert http(broker, "GET", "/api/queues/%2F/work")[1]["messages_ready"] == 2
    get_form = driver.find_element(By.ID, "get-form")
    get_form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()  # ack_requeue_true: stays
    wait(driver, lambda d: "first" in text_of(d, "#got"))
    driver.find_element(By.ID, "purge").click()
    accept_confirm(driver)
    wait(driver, lambda d: http(broker, "GET", "/api/queues/%2F/work")[1]["messages_ready"] == 0)
    audit = http(broker, "GET", "/api/leveret/audit?limit=1")[1]
    assert audit[0]["action"] == "queue.purge" and audit[0]["user"] == "guest"


def test_the_queues_page_pages_through_many_queues(driver, broker):
    names = [f"many-{n:03d}" for n in range(120)]
    for name in names:
        http(broker, "PUT", f"/api/queues/%2F/{name}", {"durable": False})
    try:
        login(driver, broker)
        driver.get(broker.http_url.rstrip("/") + "/#/queues")
        pager = wait(driver, ec.presence_of_element_located((By.CSS_SELECTOR, "#main .pager")))
        assert "page 1 of 2" in pager.text
        shown = text_of(driver, "#queues-table")
        assert "many-000" in shown and "many-119" not in shown
        pager.find_element(By.XPATH, ".//button[contains(., 'next')]").click()
        wait(driver, lambda d: "many-119" in text_of(d, "#queues-table"))
        assert "page 2 of 2" in text_of(driver, "#main .pager")
    finally:
        for name in names:
            http(broker, "DELETE", f"/api/queues/%2F/{name}")


def test_the_queues_page_filters_and_sorts_on_the_server(driver, broker):
    names = [f"sorted-{n:03d}" for n in range(120)]
    for name in names:
        http(broker, "PUT", f"/api/queues/%2F/{name}", {"durable": False})
    http(
        broker,
        "POST",
        "/api/exchanges/%2F/amq.default/publish",
        {"routing_key": "sorted-007", "payload": "x", "payload_encoding": "string", "properties": {}},
    )
    try:
        login(driver, broker)
        driver.get(broker.http_url.rstrip("/") + "/#/queues")
        form = wait(driver, ec.presence_of_element_located((By.CSS_SELECTOR, "#queues-view")))
        form.find_element(By.CSS_SELECTOR, "#queues-filter").send_keys("sorted-1")
        form.find_element(By.CSS_SELECTOR, "button").click()
        wait(driver, lambda d: "sorted-119" in text_of(d, "#queues-table"))
        assert "sorted-007" not in text_of(driver, "#queues-table")
        assert "20 matching" in text_of(driver, "#queues-matching")  # sorted-100 .. sorted-119
        form = driver.find_element(By.CSS_SELECTOR, "#queues-view")
        form.find_element(By.CSS_SELECTOR, "#queues-filter").clear()
        form.find_element(By.CSS_SELECTOR, "#queues-sort option[value='messages']").click()
        form.find_element(By.CSS_SELECTOR, "#queues-reverse").click()
        form.find_element(By.CSS_SELECTOR, "button").click()
        # the one queue with a message first, though page 1 by name would not show it first
        first_row = "#queues-table tbody tr"
        wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, first_row).text.startswith("/ sorted-007"))
    finally:
        for name in names:
            http(broker, "DELETE", f"/api/queues/%2F/{name}")


def test_admin_pages_follow_the_tags(driver, broker):
    login(driver, broker)
    wait(driver, ec.presence_of_element_located((By.ID, "overview")))
    driver.get(broker.http_url.rstrip("/") + "/#/admin")
    users = wait(driver, ec.presence_of_element_located((By.ID, "users-table")))
    assert "watcher" in users.text and "guest" in users.text
    login(driver, broker, "watcher")
    wait(driver, ec.presence_of_element_located((By.ID, "overview")))
    assert not driver.find_element(By.ID, "nav-admin").is_displayed()
    assert "management" in text_of(driver, "#who")


def test_changes_through_the_session_cookie_need_the_csrf_token(broker):
    jar = CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    base = broker.http_url.rstrip("/")

    def call(method: str, path: str, body: dict | None = None, token: str | None = None) -> int:
        request = urllib.request.Request(
            base + path, None if body is None else json.dumps(body).encode(), method=method
        )
        request.add_header("Content-Type", "application/json")
        if token is not None:
            request.add_header("X-CSRF-Token", token)
        try:
            with opener.open(request, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code

    assert call("POST", "/api/leveret/session", {"username": "guest", "password": "nope"}) == 401
    request = urllib.request.Request(
        base + "/api/leveret/session",
        json.dumps({"username": "guest", "password": "guest"}).encode(),
        method="POST",
    )
    with opener.open(request, timeout=10) as response:
        answer = json.loads(response.read())
        cookie = response.headers["Set-Cookie"]
    assert answer["user"] == "guest" and len(answer["csrf_token"]) >= 32
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert call("GET", "/api/queues") == 200  # reading needs no token
    assert call("PUT", "/api/queues/%2F/csrf-q", {"durable": False}) == 403
    assert call("PUT", "/api/queues/%2F/csrf-q", {"durable": False}, token="forged") == 403
    assert http(broker, "GET", "/api/queues/%2F/csrf-q")[0] == 404
    assert call("PUT", "/api/queues/%2F/csrf-q", {"durable": False}, token=answer["csrf_token"]) == 201
    assert call("DELETE", "/api/leveret/session") == 403  # no logging out from another site
    assert call("DELETE", "/api/leveret/session", token=answer["csrf_token"]) == 204
    assert call("GET", "/api/queues") == 401  # the session is over
    assert http(broker, "DELETE", "/api/queues/%2F/csrf-q")[0] == 204  # basic auth needs no token


def test_the_dead_letter_flow(driver, broker):
    """Three rejected messages and one expired one in ``dlq``: filter the rejected ones,
    count them, retry them to origin, watch the count drop to 1, read the audit log."""
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    channel = connection.channel()
    dead_letters(channel)

    login(driver, broker)
    wait(driver, ec.presence_of_element_located((By.ID, "overview")))
    driver.find_element(By.LINK_TEXT, "Dead letters").click()
    listing = wait(driver, ec.presence_of_element_located((By.ID, "dlq-list")))
    assert "rejected: 3" in listing.text and "expired: 1" in listing.text and "orders: 3" in listing.text
    listing.find_element(By.LINK_TEXT, "dlq").click()
    wait(driver, lambda d: text_of(d, "#dlq-count") == "4")
    assert len(driver.find_elements(By.CSS_SELECTOR, "#dlq-table input.pick")) == 4

    form = driver.find_element(By.ID, "filter-form")
    form.find_element(By.NAME, "reason").send_keys("rejected")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#dlq-table input.pick")) == 3)
    first = driver.find_element(By.CSS_SELECTOR, "#dlq-table details")
    first.click()
    assert '"order": 1' in first.find_element(By.CSS_SELECTOR, "pre.body").text  # JSON, pretty-printed

    driver.find_element(By.CSS_SELECTOR, "#action-scope option[value=filter]").click()
    driver.find_element(By.ID, "preview").click()
    wait(driver, lambda d: text_of(d, "#preview-result") == "3 message(s)")
    driver.find_element(By.ID, "action-retry").click()
    accept_confirm(driver)
    wait(driver, lambda d: "done: 3 done, 0 failed" in text_of(d, "#job-status"))
    wait(driver, lambda d: text_of(d, "#dlq-count") == "1")
    assert channel.queue_declare("orders", passive=True).method.message_count == 2
    assert channel.queue_declare("payments", passive=True).method.message_count == 1
    connection.close()

    driver.find_element(By.LINK_TEXT, "Audit log").click()
    trail = wait(driver, ec.presence_of_element_located((By.ID, "audit-table")))
    assert "dead-letters.retry.done" in trail.text and "dead-letters.retry" in trail.text
    assert "matching=3" in trail.text and "done=3" in trail.text
    try:
        driver.switch_to.alert.dismiss()
    except NoAlertPresentException:
        pass
