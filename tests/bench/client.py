#!/usr/bin/python3
"""A sequential keep-alive client for bench-profile: sends N requests, one
at a time on one connection, and checks that each was what it should be.

  client.py PORT forward|replay N TAG

forward sends keys TAG-0 .. TAG-(N-1), each for the first time, and wants
a forwarded 201; replay sends the same requests again and wants each
replayed (Idempotent-Replayed: true). Exits 1 on the first surprise."""
import http.client
import sys

BODY = b'{"amount": 1000, "currency": "eur", "description": "bench"}'


def main():
    port, mode, n, tag = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), \
        sys.argv[4]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for i in range(n):
        key = "%s-%d" % (tag, i)
        conn.request("POST", "/v1/payments", body=BODY, headers={
            "Content-Type": "application/json", "Idempotency-Key": key})
        resp = conn.getresponse()
        resp.read()
        replayed = resp.getheader("Idempotent-Replayed") == "true"
        if resp.status != 201 or replayed != (mode == "replay"):
            sys.exit("client: %s of %s: status %d, replayed %s"
                     % (mode, key, resp.status, replayed))
    conn.close()


if __name__ == "__main__":
    main()
