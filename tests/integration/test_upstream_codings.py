"""Compressed answers (Content-Encoding): stored with their coding whatever
replay_headers says, replayed labelled to a retry that accepts the coding and
decoded for one that does not, on the store path and the replay-cache path
alike; and what the upstream is asked for."""
import gzip
import http.client
import json
import socket
import threading
import zlib

import pytest

from helpers import is_replay, new_key, raw_request, wait_until
from misbehaving import Respond
from store_support import PAY
from test_upstream_answers import answer_for, post_raw, raw, stored_headers  # noqa: F401


def compressed(coding, data):
    if coding == "gzip":
        return gzip.compress(data)
    return zlib.compress(data)  # HTTP "deflate" is the zlib format


def compressing_upstream(raw, coding):
    """Compresses with `coding` whenever the request accepts it."""
    def handler(req):
        body = answer_for(req)
        ae = ",".join(req.headers("Accept-Encoding")).lower()
        hdrs = [("Content-Type", "application/json"), ("ETag", '"v1"')]
        if coding in ae:
            return Respond(201, compressed(coding, body), hdrs + [("Content-Encoding", coding)])
        return Respond(201, body, hdrs)
    return raw(handler)


@pytest.mark.parametrize("cache", ["replay_cache", "store"])
@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_compressed_answer_replays_readable(make_proxy, raw, pg, coding, cache):
    up = compressing_upstream(raw, coding)
    top = {"replay_cache_size": 0} if cache == "store" else {}
    proxy = make_proxy(routes=[{"name": "create_payment", "path": PAY, "upstream": up.url}],
                       top=top)
    key = new_key()
    first = post_raw(proxy, key, coding)
    assert first.status_code == 201
    assert first.header("Content-Encoding") == coding
    plain = zlib.decompress(first.content, 47)  # gzip or zlib
    assert json.loads(plain)["key"] == key
    rec = pg.record(key)
    assert rec["state"] == "completed"
    assert "content-encoding: %s" % coding in stored_headers(rec).lower()
    assert bytes(rec["response_body"]) == first.content

    # a retry that accepts the coding gets it, labelled
    again = post_raw(proxy, key, "%s, br" % coding)
    assert is_replay(again)
    assert again.header("Content-Encoding") == coding
    assert again.content == first.content
    assert again.header("ETag") == '"v1"'

    # a retry that does not accept it gets the plain body
    for ae in (None, "identity", "br", "%s;q=0, identity" % coding, "*;q=0, identity"):
        r = post_raw(proxy, key, ae)
        assert is_replay(r), ae
        assert r.header("Content-Encoding") is None, (ae, r.header_list)
        assert r.content == plain, ae
        assert r.header("Content-Type") == "application/json"
        # another representation: its validator can only be weak
        assert r.header("ETag") == 'W/"v1"'
    assert up.count(key) == 1


def test_upstream_is_asked_only_for_codings_the_proxy_can_decode(make_proxy, raw, pg):
    up = raw(lambda req: Respond(201, answer_for(req), [("Content-Type", "application/json")]))
    proxy = make_proxy(routes=[{"name": "create_payment", "path": PAY, "upstream": up.url},
                               {"name": "list", "path": "/v1/list", "upstream": up.url,
                                "methods": ["PUT"]}])
    cases = {
        "br, gzip;q=0.5, zstd": "gzip;q=0.5",
        "br": "identity",
        "GZIP, deflate, *": "GZIP, deflate",
        "x-gzip": "x-gzip",
    }
    for sent, expected in cases.items():
        key = new_key()
        assert post_raw(proxy, key, sent).status_code == 201
        assert up.seen(key)[0].headers("Accept-Encoding") == [expected], sent
    # unprotected requests are passed as they are
    raw_request(proxy.port, "GET", "/v1/list", [("Accept-Encoding", "br")])
    assert [r.headers("Accept-Encoding") for r in up.seen() if r.method == "GET"] == [["br"]]




# Decoded, just under max_response (256MiB): zlib needs a few hundred ms.
HUGE = 250 << 20


@pytest.fixture(scope="module")
def huge_gzip():
    return gzip.compress(bytes(HUGE), 1)


def rss_bytes(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_decoding_a_huge_stored_body_holds_up_no_other_client(make_proxy, raw, pg, huge_gzip):
    """A retry that makes the proxy decode a 250MiB gzip body: while that
    runs, another client's fresh request is still claimed, sent, recorded
    and answered, before the retry's answer starts."""
    def handler(req):
        if req.key.startswith("huge"):
            return Respond(201, huge_gzip, [("Content-Type", "application/octet-stream"),
                                            ("Content-Encoding", "gzip")])
        return Respond(201, answer_for(req), [("Content-Type", "application/json")])
    up = raw(handler)
    proxy = make_proxy(routes=[{"name": "create_payment", "path": PAY, "upstream": up.url}])
    big = new_key("huge")
    first = post_raw(proxy, big, "gzip")
    assert first.status_code == 201 and first.content == huge_gzip
    other = new_key("other")
    pid = proxy.proc.pid
    base = rss_bytes(pid)
    events = []

    def heavy():
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=60)
        try:
            sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Idempotency-Key: %s\r\nContent-Length: 34\r\n\r\n"
                         b'{"amount": 100, "currency": "EUR"}' % (PAY.encode(), big.encode()))
            resp = http.client.HTTPResponse(sock, method="POST")
            resp.begin()
            events.append("heavy answered")
            n = 0
            while True:
                chunk = resp.read(1 << 20)
                if not chunk:
                    break
                assert chunk.count(0) == len(chunk)
                n += len(chunk)
            events.append(("heavy", resp.status, resp.getheader("Content-Encoding"), n))
        finally:
            sock.close()

    t = threading.Thread(target=heavy)
    t.start()
    # The decode has begun once the proxy holds a good part of the body.
    wait_until(lambda: rss_bytes(pid) - base > (64 << 20) or events,
               what="the proxy to start decoding", interval=0.001)
    assert not events, "the retry was answered before it could be overtaken"
    r = proxy.post(PAY, key=other, json={"amount": 1})
    events.append("other answered")
    t.join(60)
    assert r.status_code == 201 and not is_replay(r)
    assert events[0] == "other answered", events
    assert events[-1] == ("heavy", 201, None, HUGE)
    assert up.count(big) == 1 and up.count(other) == 1
