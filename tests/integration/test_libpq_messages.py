"""libpq's messages span lines ("...failed: Connection refused\\n\\tIs the
server running on that host...?\\n"): in the log they are folded into one
readable line, in both formats."""
import json

import pytest

import requests

from conftest import ADMIN_TOKEN
from helpers import TIMEOUT, new_key, wait_until
from pg_relay import PgRelay

PAY = "/v1/payments"
HINT = "Is the server running on that host"
CLOSED = "server closed the connection unexpectedly"


def store_lines(proxy, fmt, what):
    lines = [l for l in proxy.log().splitlines() if what in l]
    if fmt == "json":
        return [json.loads(l)["detail"] for l in lines]
    return lines


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_a_multi_line_libpq_error_is_one_readable_line(make_proxy, pg, pg_cluster, fmt):
    relay = PgRelay(pg_cluster.port)
    try:
        proxy = make_proxy(top={"log_format": fmt, "workers": 1,
                                "database": {"url": relay.url(pg.name)}})
    finally:
        # The worker's connection is cut (libpq: "server closed the
        # connection unexpectedly\n\tThis probably means..."), and
        # nothing listens there any more: the admin API's first connection
        # gets "Connection refused" with a hint on a second, tab-indented
        # line.
        relay.stop()
        relay.terminate_all()
    r = proxy.post(PAY, key=new_key(), json={"amount": 1})
    assert r.status_code == 503, r.content
    r = requests.get(proxy.admin_url + "/admin/keys/default/create_payment/" + new_key(),
                     headers={"Authorization": "Bearer " + ADMIN_TOKEN}, timeout=TIMEOUT)
    assert r.status_code == 503, r.content
    closed = wait_until(lambda: store_lines(proxy, fmt, CLOSED), what="a cut line")
    refused = wait_until(lambda: store_lines(proxy, fmt, HINT), what="a refused line")
    for text in closed + refused:
        assert "\n" not in text and "\t" not in text, text
        # the text format shows what is not printable as \xHH
        assert "\\x0a" not in text and "\\x09" not in text, text
        # libpq's closing newline is dropped, not made a separator
        assert not text.endswith(("; ", " ", ";")), text
    for text in closed:
        assert CLOSED + "; This probably means" in text, text
    for text in refused:
        assert "Connection refused; " + HINT in text, text
        assert "connections?;" not in text, text
