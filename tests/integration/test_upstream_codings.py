"""Compressed answers (Content-Encoding): stored with their coding whatever
replay_headers says, replayed labelled to a retry that accepts the coding and
decoded for one that does not, on the store path and the replay-cache path
alike; and what the upstream is asked for."""
import gzip
import json
import zlib

import pytest

from helpers import is_replay, new_key, raw_request
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


