"""Every wait for the store has a deadline (doc/design.md "When things fail",
"First attempts together"): a statement whose answer never comes is given
up at statement_timeout + max(1 s, statement_timeout / 2), its connection
dropped, and the call goes on as after a lost answer; and calls queued in a
batch lane behind such a statement leave the queue instead of waiting for
it (claims go alone, records to the background retrier while their lease
lives).

A relay between the proxy and PostgreSQL (pg_relay.py) holds a statement's
answer until the test releases it: each test checks what happened while
the hold was still in place, so that nothing depends on how long a wait
took. The statements still run to their end on the server: the answer is
lost, not the work."""
import threading

import pytest
import requests

from conftest import CITUS
from helpers import TIMEOUT, is_replay, new_key, wait_until
from pg_relay import PgRelay
from store_support import PAY, pay
from test_ops import scrape

# statement_timeout 1 s: every store wait ends after 2 s.
STORE = {"statement_timeout": "1s"}
# A request still unanswered after this is stuck behind the held answer.
HANG = 12.0
# A short lease, and an upstream call that fits in it.
SHORT_LEASE = {"create_payment": {"lease": "4s", "upstream_timeout": "1s"}}


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


BATCH = {"workers": 16}


@pytest.mark.no_replay_cache
@pytest.mark.skipif(CITUS, reason="on Citus nothing is batched")
def test_records_queued_behind_a_held_batch_are_written_within_their_lease(
        make_proxy, stub, pg, relay):
    """One record waits alone (its answer held), the next goes out as the
    record lane's statement (its answer held on every try), and five more
    arrive behind it. Clients retry every key past the 4 s lease. Before
    the fix the five waited in the queue for the held statement, their
    leases ended, and the retries executed those keys again."""
    proxy = make_proxy(top=dict(BATCH, database=db(relay, pg)),
                       route_overrides=SHORT_LEASE)
    assert pay(proxy, new_key("warm")).status_code == 201
    sent = Sent(proxy)
    alone = new_key("rec-alone")
    relay.hold("complete", seconds=None, phase="answer")
    sent.send(alone)
    wait_until(lambda: relay.held == 1, what="the lone record's answer held")
    relay.hold("complete_many", seconds=None, phase="answer", shots=None)
    batched, behind = new_key("rec-batched"), [new_key("rec-behind") for _ in range(5)]
    stub.configure({"prefix": PAY, "key": batched, "gate": "batched"},
                   {"prefix": PAY, "gate": "behind"}, append=True)
    for k in [batched] + behind:
        sent.send(k)
    wait_until(lambda: all(stub.count(key=k) == 1 for k in [batched] + behind),
               what="every key at the upstream")
    stub.release("batched")
    wait_until(lambda: relay.held == 2, what="the batch's answer held")
    stub.release("behind")
    keys = [batched] + behind
    every = [alone] + keys

    def settled():
        # Each key retried, as a client whose answer is late would (one
        # whose retry gets no answer soon gives up and retries later).
        for k in every:
            try:
                pay(proxy, k, timeout=2)
            except requests.exceptions.Timeout:
                pass
        if any(stub.count(key=k) > 1 for k in every):
            return True  # executed again: the test has failed
        return all(stub.count(key=k) == 1 and pg.record(k)["state"] == "completed"
                   for k in every) and sent.answered(every)
    wait_until(settled, timeout=HANG, interval=0.3,
               what="every record written while the batch is held")
    relay.release()
    sent.join()
    twice = {k: stub.count(key=k) for k in every if stub.count(key=k) != 1}
    assert not twice, "keys executed more than once: %r" % twice
    for k in every:
        r = sent.out[k]
        assert not isinstance(r, Exception) and r.status_code == 201, (k, r)


@pytest.mark.no_replay_cache
@pytest.mark.skipif(CITUS, reason="on Citus nothing is batched")
def test_claims_behind_a_held_batch_are_served_while_it_is_held(
        make_proxy, stub, pg, relay):
    """One claim waits alone (its answer held), the next goes out as the
    claim lane's statement (held on every try until released). Keys that
    arrive after it are forwarded while both holds are still in place."""
    proxy = make_proxy(top=dict(BATCH, database=db(relay, pg)))
    assert pay(proxy, new_key("warm")).status_code == 201
    sent = Sent(proxy)
    alone, first = new_key("claim-alone"), new_key("claim-batched")
    relay.hold("claim_new", seconds=None, phase="answer")
    sent.send(alone)
    wait_until(lambda: relay.held == 1, what="the lone claim's answer held")
    relay.hold("claim_many", seconds=None, phase="answer", shots=None)
    sent.send(first)
    wait_until(lambda: relay.held == 2, what="the batch's answer held")
    later = [new_key("claim-later") for _ in range(5)]
    for k in later:
        sent.send(k)
    wait_until(lambda: sent.answered(later), timeout=HANG,
               what="the later keys answered while the batch is held")
    forwarded_while_held = {k: stub.count(key=k) for k in later}
    relay.release()
    sent.join()
    assert forwarded_while_held == {k: 1 for k in later}
    for k in [alone, first] + later:
        r = sent.out[k]
        assert not isinstance(r, Exception) and r.status_code == 201, (k, r)
        assert stub.count(key=k) == 1, k
