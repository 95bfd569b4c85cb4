"""Cross-origin answers (doc/design.md, "Browsers and CORS"): where the
upstream lets an origin read its answer, browser code can read the headers
the proxy adds (Idempotent-Replayed, Preference-Applied) on first answers and
replays alike; the proxy grants no CORS access the upstream did not grant,
and a preflight passes through as it is.

The browser test drives a real headless Chromium (Debian's chromium and
chromium-driver, python3-selenium) on a page served from a second loopback
origin."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from helpers import TIMEOUT, free_port, is_replay, new_key

PAY = "/v1/payments"
EXPOSE = "Access-Control-Expose-Headers"
OWN = ["Idempotent-Replayed", "Preference-Applied"]


def names(value):
    return [n.strip() for n in (value or "").split(",") if n.strip()]


def cors_rules(origin, expose="Location"):
    """The upstream's CORS policy for origin: preflights allowed for the
    key header, answers readable with expose (None: no list of its own)."""
    post_headers = {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
    if expose is not None:
        post_headers[EXPOSE] = expose
    return [
        {"method": "OPTIONS", "prefix": PAY, "status": 204, "body": "",
         "replace_headers": True,
         "headers": {"Access-Control-Allow-Origin": origin,
                     "Access-Control-Allow-Methods": "POST",
                     "Access-Control-Allow-Headers": "Idempotency-Key, Content-Type",
                     "Access-Control-Max-Age": "0", "Vary": "Origin"}},
        {"method": "POST", "prefix": PAY, "headers": post_headers},
    ]


# --- without a browser ----------------------------------------------------------

def test_expose_headers_merged_on_first_answer_and_replay(proxy, stub):
    origin = "https://shop.example"
    stub.configure(*cors_rules(origin, expose="Location, X-Charge-Id"))
    key = new_key()
    body = {"amount": 100}
    first = proxy.post(PAY, key=key, json=body, headers={"Origin": origin})
    replay = proxy.post(PAY, key=key, json=body, headers={"Origin": origin})
    assert first.status_code == 201 and not is_replay(first)
    assert replay.status_code == 201 and is_replay(replay)
    assert replay.json()["id"] == first.json()["id"]
    for r in (first, replay):
        # the upstream's list first, as written, then the proxy's names
        assert names(r.headers[EXPOSE]) == ["Location", "X-Charge-Id"] + OWN
        assert r.headers["Access-Control-Allow-Origin"] == origin
    assert stub.count(key=key, method="POST") == 1


@pytest.mark.no_replay_cache
def test_record_keeps_the_upstreams_cors_headers_and_replays_them_merged(proxy, stub, pg):
    """From the store (no replay cache): the record holds the upstream's
    CORS headers as the upstream sent them, whatever replay_headers says;
    the proxy's names are merged when the replay is sent."""
    origin = "https://shop.example"
    stub.configure(*cors_rules(origin, expose="Location"))
    key = new_key()
    proxy.post(PAY, key=key, json={"amount": 3}, headers={"Origin": origin})
    stored = bytes(pg.record(key)["response_headers"]).decode("latin-1")
    assert "Access-Control-Allow-Origin: %s\r\n" % origin in stored
    assert "Access-Control-Expose-Headers: Location\r\n" in stored
    replay = proxy.post(PAY, key=key, json={"amount": 3}, headers={"Origin": origin})
    assert is_replay(replay)
    assert replay.headers["Access-Control-Allow-Origin"] == origin
    assert names(replay.headers[EXPOSE]) == ["Location"] + OWN
    assert stub.count(key=key, method="POST") == 1


def test_credentialed_wildcard_gets_names_listed(proxy, stub):
    """Fetch: "*" in Access-Control-Expose-Headers is no wildcard for a
    credentialed request; with Access-Control-Allow-Credentials the proxy
    names its headers next to it, without it the wildcard already covers
    them and the upstream's list is left as it is."""
    origin = "https://shop.example"
    rules = cors_rules(origin, expose="*")
    rules[1]["headers"]["Access-Control-Allow-Credentials"] = "true"
    stub.configure(*rules)
    key = new_key()
    r = proxy.post(PAY, key=key, json={"amount": 1}, headers={"Origin": origin})
    assert names(r.headers[EXPOSE]) == ["*"] + OWN

    stub.configure(*cors_rules(origin, expose="*"))
    key = new_key()
    r = proxy.post(PAY, key=key, json={"amount": 1}, headers={"Origin": origin})
    assert r.headers[EXPOSE] == "*"
    assert stub.count(method="POST") == 2


def test_upstream_without_cors_gets_no_expose_headers(proxy, stub):
    key = new_key()
    first = proxy.post(PAY, key=key, json={"amount": 7},
                       headers={"Origin": "https://shop.example"})
    replay = proxy.post(PAY, key=key, json={"amount": 7},
                        headers={"Origin": "https://shop.example"})
    assert is_replay(replay) and not is_replay(first)
    for r in (first, replay):
        assert EXPOSE not in r.headers
        assert "Access-Control-Allow-Origin" not in r.headers
    assert stub.count(key=key, method="POST") == 1


def test_preflight_passes_through_unchanged(proxy, stub):
    origin = "https://shop.example"
    stub.configure(*cors_rules(origin))
    r = proxy.request("OPTIONS", PAY, headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "idempotency-key,content-type"})
    assert r.status_code == 204
    assert r.headers["Access-Control-Allow-Origin"] == origin
    assert r.headers["Access-Control-Allow-Headers"] == "Idempotency-Key, Content-Type"
    assert EXPOSE not in r.headers
    seen = stub.requests(method="OPTIONS")
    assert len(seen) == 1
    assert seen[0].header("Access-Control-Request-Method") == "POST"
    assert seen[0].header("Origin") == origin


def test_own_problem_answers_carry_no_cors_headers(proxy, stub):
    """The proxy does not know the upstream's CORS policy and grants none
    itself: its own problem answers are unreadable to cross-origin browser
    code (doc/design.md says why and what a browser client does)."""
    origin = "https://shop.example"
    stub.configure(*cors_rules(origin))
    r = proxy.post(PAY, json={"amount": 1}, headers={"Origin": origin})  # no key
    assert r.status_code == 400
    assert "Access-Control-Allow-Origin" not in r.headers
    assert EXPOSE not in r.headers
    assert stub.count(method="POST") == 0


# --- with a browser -------------------------------------------------------------

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>shop</title></head><body>
<script>
// Two POSTs with one key, as a browser client retries after a lost answer;
// reports what script code can read of each answer.
async function payTwice(url, key) {
  const out = [];
  for (let i = 0; i < 2; i++) {
    try {
      const r = await fetch(url, {
        method: "POST", mode: "cors",
        headers: {"Idempotency-Key": key, "Content-Type": "application/json"},
        body: JSON.stringify({amount: 100, currency: "EUR"})});
      out.push({status: r.status,
                replayed: r.headers.get("Idempotent-Replayed"),
                location: r.headers.get("Location"),
                internal: r.headers.get("X-Internal"),
                id: (await r.json()).id});
    } catch (e) {
      out.push({error: String(e)});
    }
  }
  return out;
}
</script></body></html>
"""


def wait_listening(port, proc, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the page server exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("the page server did not listen within %.0fs" % timeout)


@pytest.fixture
def page_origin(tmp_path):
    """A second origin (another loopback port) serving the shop's page."""
    root = tmp_path / "site"
    root.mkdir()
    (root / "index.html").write_text(PAGE)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
                             "--directory", str(root), str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port, proc)
        yield "http://127.0.0.1:%d" % port
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.add_argument("--headless=new")
    # CI runs the tests as root, and Chromium refuses to start its sandbox
    # as root; the page is our own, so running it unsandboxed is fine here.
    opts.add_argument("--no-sandbox")
    opts.add_argument("--disable-dev-shm-usage")
    opts.add_argument("--disable-gpu")
    opts.add_argument("--user-data-dir=%s" % (tmp_path / "chromium"))
    service = Service(executable_path="/usr/bin/chromedriver",
                      log_path=os.devnull)
    driver = webdriver.Chrome(service=service, options=opts)
    try:
        driver.set_page_load_timeout(TIMEOUT)
        driver.set_script_timeout(TIMEOUT)
        yield driver
    finally:
        driver.quit()


def test_browser_reads_replay_marker(proxy, stub, page_origin, browser):
    stub.configure(*cors_rules(page_origin))
    browser.get(page_origin + "/index.html")
    key = new_key()
    got = browser.execute_async_script(
        "payTwice(arguments[0], arguments[1]).then(arguments[2]);",
        proxy.url + PAY, key)
    first, replay = got
    assert "error" not in first, got
    assert "error" not in replay, got
    assert first["status"] == 201 and replay["status"] == 201
    # the first answer carries no marker; the replay's is readable
    assert first["replayed"] is None
    assert replay["replayed"] == "true"
    assert replay["id"] == first["id"]
    # the upstream's own list still works; what it did not expose stays hidden
    assert first["location"] and replay["location"] == first["location"]
    assert first["internal"] is None
    # one execution: the browser's preflights passed through, the POST once
    assert stub.count(key=key, method="POST") == 1
    assert stub.count(method="OPTIONS") >= 1
    assert all(r.header("Origin") == page_origin for r in stub.requests(method="OPTIONS"))
