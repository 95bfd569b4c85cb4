"""A known outcome is never forgotten while its lease lasts: when the store
connection broke during the upstream call, the worker reconnects and records
at once; when the store is still down, the worker keeps the client waiting
and writes the record itself as soon as the store is back (until the lease
ends, less its margin, also during a SIGTERM's shutdown_grace): the client
never gets an answer whose record is not written (test_unrecorded.py).

These tests crash and stop PostgreSQL, so they run against a cluster of
their own (private_pg.py)."""
import threading
import time

import pytest

from helpers import TIMEOUT, is_replay, new_key, wait_until
from private_pg import PrivatePgCluster
from store_support import PAY, pay, wait_state
from test_outage import HANG, Outage, counter


@pytest.fixture(scope="module")
def pg_cluster():
    cluster = PrivatePgCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.dropper.shutdown(wait=True)
        cluster.stop()


def held_request(proxy, stub, key):
    """Starts pay(proxy, key) in a thread, held at the stub's gate; returns
    (thread, answers) once the request has reached the upstream."""
    stub.configure({"prefix": PAY, "key": key, "gate": "hold", "times": 1})
    answers = []
    t = threading.Thread(target=lambda: answers.append(pay(proxy, key, timeout=HANG)))
    t.start()
    stub.wait_for(key=key)
    return t, answers


def retrying(proxy):
    """Until the worker is trying the record again, the client waiting."""
    wait_until(lambda: "trying again while the client waits" in proxy.log(),
               what="the worker to try the record again")


def answer(stub, t, answers):
    stub.release("hold")
    t.join(HANG + 5)
    assert answers, "no answer to the client"
    return answers[0]


@pytest.mark.no_replay_cache
@pytest.mark.parametrize("on_unknown", ["hold", "release_after_lease"])
def test_answer_is_recorded_after_the_database_crash_restarted_during_the_call(
        make_proxy, stub, pg, pg_cluster, on_unknown):
    # The test clusters run with synchronous_commit off, which may lose the
    # last commits in a crash; a real deployment does not, nor does this.
    pg.execute("ALTER DATABASE %s SET synchronous_commit = on" % pg.name)
    proxy = make_proxy(top={"workers": 1},
                       route_overrides={"create_payment": {"on_unknown": on_unknown}})
    assert pay(proxy, new_key("warm")).status_code == 201  # the worker is connected
    key = new_key("crash")
    t, answers = held_request(proxy, stub, key)
    try:
        pg.close()
        pg_cluster.crash_restart()
    finally:
        r = answer(stub, t, answers)
    assert r.status_code == 201 and not is_replay(r), r.content
    rec = wait_state(pg, key, "completed")
    assert rec["attempt"] == 1 and bytes(rec["response_body"]) == r.content
    again = pay(proxy, key)
    assert again.status_code == 201 and is_replay(again), again.content
    assert again.content == r.content
    assert stub.count(key=key) == 1
    assert counter(proxy, "idemproxy_events_total", event="record_failed") == 0


@pytest.mark.no_replay_cache
def test_answer_waits_for_its_record_until_the_database_is_back(
        make_proxy, stub, pg, pg_cluster):
    proxy = make_proxy(top={"workers": 1})
    assert pay(proxy, new_key("warm")).status_code == 201
    key = new_key("later")
    t, answers = held_request(proxy, stub, key)
    try:
        with Outage(pg, pg_cluster):
            stub.release("hold")
            retrying(proxy)
            # not answered while the store is down: the record is not written
            assert not answers, answers[0].content
    finally:
        stub.release("hold")
        t.join(HANG)
    assert answers, "no answer to the client"
    r = answers[0]
    assert r.status_code == 201 and not is_replay(r), r.content
    rec = wait_state(pg, key, "completed", timeout=20)
    assert rec["attempt"] == 1 and bytes(rec["response_body"]) == r.content
    again = pay(proxy, key)
    assert again.status_code == 201 and is_replay(again), again.content
    assert again.content == r.content
    assert stub.count(key=key) == 1
    assert counter(proxy, "idemproxy_events_total", event="record_retried") == 1
    assert counter(proxy, "idemproxy_events_total", event="record_failed") == 0
    assert counter(proxy, "idemproxy_events_total", event="record_deferred") == 0


@pytest.mark.no_replay_cache
def test_pending_record_is_written_during_the_shutdown_grace(make_proxy, stub, pg,
                                                            pg_cluster):
    proxy = make_proxy(top={"workers": 1, "shutdown_grace": "30s"})
    assert pay(proxy, new_key("warm")).status_code == 201
    key = new_key("sigterm")
    t, answers = held_request(proxy, stub, key)
    try:
        with Outage(pg, pg_cluster):
            stub.release("hold")
            retrying(proxy)
            proxy.proc.terminate()  # SIGTERM while the store is down
            wait_until(lambda: "shutting down" in proxy.log(), what="the shutdown to begin")
            assert not answers, answers[0].content
    finally:
        stub.release("hold")
        t.join(HANG)
    assert answers, "no answer to the client"
    r = answers[0]
    assert r.status_code == 201, r.content
    assert proxy.wait_exit(timeout=40) == 0, proxy.log()[-3000:]
    rec = wait_state(pg, key, "completed")
    assert bytes(rec["response_body"]) == r.content
    assert stub.count(key=key) == 1
    assert "outcome recorded after the store came back" in proxy.log()


@pytest.mark.no_replay_cache
def test_a_sealed_answer_is_recorded_once_the_database_is_back(make_proxy, stub, pg,
                                                              pg_cluster, tmp_path):
    # with store_encryption on, what the worker writes again is the sealed
    # form, and it is what reaches the store
    from test_seal import K1, write_keys
    keys = write_keys(str(tmp_path / "keys"), {"k1": K1}, "k1")
    proxy = make_proxy(top={"workers": 1, "store_encryption": {"keys": keys}})
    assert pay(proxy, new_key("warm")).status_code == 201
    key = new_key("sealed")
    t, answers = held_request(proxy, stub, key)
    try:
        with Outage(pg, pg_cluster):
            stub.release("hold")
            retrying(proxy)
            assert not answers, answers[0].content
    finally:
        stub.release("hold")
        t.join(HANG)
    assert answers, "no answer to the client"
    r = answers[0]
    assert r.status_code == 201 and not is_replay(r), r.content
    rec = wait_state(pg, key, "completed", timeout=20)
    assert rec["seal_key"] == "k1"
    body = bytes(rec["response_body"])
    assert body[:1] == b"\x00" and r.content not in body
    again = pay(proxy, key)
    assert again.status_code == 201 and is_replay(again), again.content
    assert again.content == r.content
    assert stub.count(key=key) == 1
    assert counter(proxy, "idemproxy_events_total", event="record_retried") == 1
