"""The proxy never gives a client an upstream answer whose record is not
written (doc/design.md "When things fail"): when the record fails, the
worker writes it again while the client waits, for as long as the
attempt's lease (less its margin) allows; if it cannot, or another attempt
took the key over (the write is fenced), the client gets 503
`idempotency_outcome_unrecorded` instead of the upstream's answer. Else a
client could see a 201 that the key never replays: after a proxy crash a
retry would execute again (release_after_lease) or be held (hold).

A relay between the proxy and PostgreSQL (pg_relay.py) cuts the record's
statement before the server sees it; each test checks what the client got
while the relay still held or cut, so that nothing depends on timings."""
import signal
import threading

import pytest

from helpers import is_replay, new_key, wait_until
from store_support import PAY, pay, wait_state
from test_ops import scrape
from test_store_waits import relay  # noqa: F401 (a fixture)

STORE = {"statement_timeout": "1s"}
# A short lease, and an upstream call that fits in it.
LEASE = {"lease": "4s", "upstream_timeout": "1s"}
HANG = 20.0


def start(make_proxy, relay, pg, on_unknown="hold"):
    route = dict(LEASE, on_unknown=on_unknown)
    proxy = make_proxy(top={"workers": 1,
                            "database": dict(STORE, url=relay.url(pg.name))},
                       route_overrides={"create_payment": route})
    assert pay(proxy, new_key("warm")).status_code == 201
    return proxy


def send(proxy, key):
    """pay(proxy, key) from a thread; the list gets its answer."""
    out = []
    t = threading.Thread(target=lambda: out.append(pay(proxy, key, timeout=HANG)))
    t.start()
    return t, out


def cut_records(relay, shots):
    """The next `shots` record statements (None: all) are cut before the
    server sees them: the record fails, also on the store's own fresh
    reconnect."""
    relay.hold("complete", seconds=0, then="cut", phase="statement", shots=shots)


def unrecorded(r):
    return (r.status_code == 503 and
            r.json()["title"] == "Upstream answer could not be recorded" and
            r.headers.get("Content-Type", "").startswith("application/problem+json") and
            r.json()["code"] == "idempotency_outcome_unrecorded")


def events(proxy, event):
    return scrape(proxy).value("idemproxy_events_total", event=event)


@pytest.mark.no_replay_cache
def test_the_answer_goes_to_the_client_only_once_its_record_is_written(
        make_proxy, stub, pg, relay):
    proxy = start(make_proxy, relay, pg)
    key = new_key("later")
    cut_records(relay, 2)   # the write and the store's own repeat
    # the worker's next try is held until the test lets it through
    relay.hold("complete", seconds=None, phase="answer")
    t, out = send(proxy, key)
    wait_until(lambda: relay.held == 3, what="the worker's own try of the record")
    answered_before_written = bool(out)
    relay.release()
    t.join(HANG + 5)
    assert not answered_before_written, "the client got an answer not yet recorded"
    r = out[0]
    assert r.status_code == 201 and not is_replay(r), r.content
    rec = wait_state(pg, key, "completed")
    assert bytes(rec["response_body"]) == r.content
    again = pay(proxy, key)
    assert again.status_code == 201 and is_replay(again) and again.content == r.content
    assert stub.count(key=key) == 1
    assert events(proxy, "record_retried") == 1
    assert events(proxy, "record_failed") == 0


@pytest.mark.no_replay_cache
def test_an_answer_not_recorded_within_the_lease_is_not_given(make_proxy, stub, pg,
                                                              relay):
    proxy = start(make_proxy, relay, pg, on_unknown="hold")
    key = new_key("never")
    cut_records(relay, None)
    t, out = send(proxy, key)
    t.join(HANG + 5)
    relay.clear()
    assert out, "no answer to the client"
    r = out[0]
    assert unrecorded(r), (r.status_code, r.content)
    assert r.headers.get("Retry-After")
    assert stub.count(key=key) == 1
    assert pg.record(key)["state"] == "processing"
    # held: the retry is refused, nothing is executed again
    again = pay(proxy, key)
    assert again.status_code == 409 and not is_replay(again), again.content
    assert stub.count(key=key) == 1
    assert events(proxy, "outcome_unrecorded") == 1
    assert events(proxy, "record_failed") == 1
    assert "could not record the outcome" in proxy.log()


@pytest.mark.no_replay_cache
def test_a_client_never_saw_the_answer_a_crash_lost(make_proxy, stub, pg, relay):
    """The bug the campaign found: the record failed, the client got the
    201, the proxy was SIGKILLed before it was written, and a retry after
    the lease executed a second time (release_after_lease). Now the client
    gets no 201 that is not recorded; the second execution after the lease
    is the documented release rule."""
    proxy = start(make_proxy, relay, pg, on_unknown="release_after_lease")
    key = new_key("crash")
    cut_records(relay, None)
    t, out = send(proxy, key)
    t.join(HANG + 5)
    assert out, "no answer to the client"
    first = out[0]
    proxy.proc.send_signal(signal.SIGKILL)
    proxy.proc.wait(10)
    proxy.acknowledged_exit = True
    relay.clear()
    assert stub.count(key=key) == 1
    proxy2 = start(make_proxy, relay, pg, on_unknown="release_after_lease")
    got = []

    def retried():
        r = pay(proxy2, key)
        if r.status_code != 409:
            got.append(r)
        return bool(got)
    wait_until(retried, timeout=HANG, what="a retry after the lease")
    again = got[0]
    if first.status_code == 201:
        # a client that saw a 201 must get it replayed, never a new one
        assert is_replay(again) and again.content == first.content, \
            "the client saw a 201 and the key executed again"
    assert unrecorded(first), (first.status_code, first.content)
    assert again.status_code == 201 and stub.count(key=key) == 2


@pytest.mark.no_replay_cache
def test_an_answer_fenced_by_another_attempt_is_not_given(make_proxy, stub, pg, relay):
    proxy = start(make_proxy, relay, pg)
    key = new_key("fenced")
    stub.configure({"prefix": PAY, "key": key, "gate": "hold", "times": 1})
    t, out = send(proxy, key)
    stub.wait_for(key=key)
    # another attempt takes the key over while this one is upstream
    pg.execute("UPDATE idempotency_records SET owner_token = gen_random_uuid(), "
               "attempt = attempt + 1 WHERE idem_key = %s", (key,))
    stub.release("hold")
    t.join(HANG + 5)
    assert out, "no answer to the client"
    r = out[0]
    assert unrecorded(r), (r.status_code, r.content)
    assert "another attempt" in r.json()["detail"]
    assert pg.record(key)["state"] == "processing"
    assert stub.count(key=key) == 1
    assert events(proxy, "record_fenced") == 1
