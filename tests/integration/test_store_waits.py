"""Every wait for the store has a deadline (README "When things fail",
"First attempts together"): a statement whose answer never comes is given
up at statement_timeout + max(1 s, statement_timeout / 2), its connection
dropped, and the call goes on as after a lost answer.

A relay between the proxy and PostgreSQL (pg_relay.py) holds a statement's
answer until the test releases it: each test checks what happened while
the hold was still in place, so that nothing depends on how long a wait
took. The statements still run to their end on the server: the answer is
lost, not the work."""
import threading

import pytest

from helpers import TIMEOUT, is_replay, new_key, wait_until
from pg_relay import PgRelay
from store_support import PAY, pay
from test_ops import scrape

# statement_timeout 1 s: every store wait ends after 2 s.
STORE = {"statement_timeout": "1s"}
# A request still unanswered after this is stuck behind the held answer.
HANG = 12.0


@pytest.fixture
def relay(pg):
    r = PgRelay(pg.cluster.port)
    yield r
    r.release()
    r.stop()


def db(relay, pg, **kw):
    return dict(STORE, url=relay.url(pg.name), **kw)


class Sent:
    """One request per key from a thread; .out[key] is its answer, or the
    exception the client got."""

    def __init__(self, proxy):
        self.proxy, self.out, self.threads = proxy, {}, []

    def send(self, key):
        def run():
            try:
                self.out[key] = pay(self.proxy, key)
            except Exception as e:  # the client's own timeout: a hang
                self.out[key] = e
        t = threading.Thread(target=run)
        t.start()
        self.threads.append(t)

    def answered(self, keys):
        return all(k in self.out and not isinstance(self.out[k], Exception)
                   for k in keys)

    def join(self):
        for t in self.threads:
            t.join(TIMEOUT + 5)


@pytest.mark.no_replay_cache
@pytest.mark.parametrize("statement", ["claim_new", "complete"])
def test_a_statement_whose_answer_never_comes_is_given_up_while_it_is_held(
        make_proxy, stub, pg, relay, statement):
    """The claim's (or the record's) answer is held for as long as the test
    likes: the proxy drops the connection at its deadline and repeats the
    statement once on a fresh one, where it finds its own insert (or its
    own record) committed and carries on as the same attempt. The client
    is answered before the hold ends; the upstream saw the key once."""
    proxy = make_proxy(top={"database": db(relay, pg, batch=1)})
    assert pay(proxy, new_key("warm")).status_code == 201
    key = new_key("held-" + statement)
    relay.hold(statement, seconds=None, phase="answer")
    sent = Sent(proxy)
    sent.send(key)
    wait_until(lambda: relay.held == 1, what="the %s answer held" % statement)
    sent.join()
    answered_while_held = sent.answered([key])
    relay.release()
    assert answered_while_held, "the request waited for the held answer"
    r = sent.out[key]
    assert not isinstance(r, Exception), r
    assert r.status_code == 201 and not is_replay(r), r.content
    assert stub.count(key=key) == 1
    assert pg.record(key)["state"] == "completed"
    again = pay(proxy, key)
    assert again.status_code == 201 and is_replay(again)
    assert stub.count(key=key) == 1
    m = scrape(proxy)
    assert m.value("idemproxy_events_total", event="store_wait_timeout") >= 1
