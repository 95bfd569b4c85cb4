"""The chaos soak's invariants, as pure functions of what was recorded.

Inputs (plain dicts and lists, so test_checker.py can feed synthetic ones):

  ups       upstream requests, merged from the faulty upstream's log:
            seq, port, method, target, key, rid, body (bytes), start,
            end (None: still running when the upstream stopped), kind,
            effect (a new effect happened), result_id, status, answered
  attempts  one per client request: key, flow, kind (req|replay|probe),
            inst, rid, t0, t1, status, code (problem code or None), error
            (transport error or None), id and body_key (from an upstream-made
            JSON body), ctypes (Content-Type header count), trailer (a
            trailer field came back as a header), decodable (body is JSON)
  flows     one per client loop (a request retried until a final answer):
            key, flow, kind, final (bool), cause (why it stopped or stuck)
  keys      key -> {"route", "body": bytes, "probes": [bytes]}
  logs      proxy log lines (parsed JSON) with "inst" added
  chaos     events: kind (kill|term|pg_restart|hup|stall), inst, t, t_end;
            a stall has stall (hold_answer|hold_statement|hold_all|dns|log|
            freeze), store (every connection to the store stalled),
            started (False: a hold that found no statement to hold), and a
            freeze frozen_at, thawed_at and polls ([{t, status}] of /readyz)
  exits     proxy exits: inst, rc, expected (the soak killed it), t (when
            the process had ended), why
  port_inst upstream port -> proxy instance

Every check returns a list of violations, each a (invariant, text) pair.
"""
import calendar
import json
import re
import time

RELEASE_STATUSES = frozenset([408, 425, 429, 500, 502, 503, 504])
FINAL_UPSTREAM = (201, 402)
UPSTREAM_LAG_S = 1.0


def by_key(ups):
    out = {}
    for r in sorted(ups, key=lambda r: (r["start"], r["seq"])):
        if r.get("key") is not None:
            out.setdefault(r["key"], []).append(r)
    return out


def _short(r):
    return "#%d %s %s rid=%s kind=%s t=%.3f-%s" % (
        r["seq"], r["method"], r["target"], r.get("rid"), r.get("kind"), r["start"],
        "%.3f" % r["end"] if r.get("end") is not None else "running")


# --- hold: at most one request per key, ever ---------------------------------

def check_one_request_per_key(ups):
    v = []
    for key, rs in by_key(ups).items():
        if len(rs) > 1:
            v.append(("one_request_per_key", "key %s reached the upstream %d times: %s"
                      % (key, len(rs), "; ".join(_short(r) for r in rs[:4]))))
    return v


# --- release_after_lease in front of a deduplicating upstream ----------------

def check_one_effect_per_key(ups):
    v = []
    for key, rs in by_key(ups).items():
        eff = [r for r in rs if r.get("effect")]
        if len(eff) > 1:
            v.append(("one_effect_per_key", "key %s had %d effects: %s"
                      % (key, len(eff), "; ".join(_short(r) for r in eff[:4]))))
    return v


def proxy_said(r, idx):
    """What the proxies logged for an upstream request, by its X-Request-Id."""
    ln = (idx.get(r.get("rid")) or {}).get("line")
    if ln is None:
        return " [no proxy log line]"
    return " [%s: attempt %s, %s %s]" % (ln.get("inst"), ln.get("attempt"),
                                         ln.get("outcome"), ln.get("status"))


def check_no_overlap(ups, logs=()):
    """Never two requests for one key in flight at the upstream at once,
    from the upstream's own start and end times."""
    v = []
    idx = index_logs(logs)
    for key, rs in by_key(ups).items():
        for i, a in enumerate(rs):
            a_end = a["end"] if a.get("end") is not None else float("inf")
            for b in rs[i + 1:]:
                if b["start"] < a_end:
                    v.append(("no_overlap", "key %s: two requests in flight at once: "
                              "%s%s and %s%s" % (key, _short(a), proxy_said(a, idx),
                                                 _short(b), proxy_said(b, idx))))
    return v


def log_time(ln):
    """A proxy log line's time as a Unix timestamp."""
    t = ln.get("time") or ""
    try:
        base = calendar.timegm(time.strptime(t[:19], "%Y-%m-%dT%H:%M:%S"))
        return base + float("0" + t[19:].rstrip("Z"))
    except ValueError:
        return None


def store_down(e):
    """Was every connection to the store lost or stalled during e?"""
    return e["kind"] == "pg_restart" or (e["kind"] == "stall" and e.get("store"))


def long_outage(t, chaos, lease_s):
    """Was the store down (crashed, or all its traffic held, or its name
    unresolvable) longer than the lease around time t? Then even a proxy
    that retries its record for the whole lease may lose it."""
    if t is None or lease_s is None:
        return False
    return any(store_down(e) and e.get("t_end") is not None
               and e["t_end"] - e["t"] >= lease_s and e["t"] <= t <= e["t_end"] + 0.5
               for e in chaos)


def _rid_of(detail):
    m = re.search(r"request_id=(\S+)", detail or "")
    return m.group(1) if m else None


def index_logs(logs):
    """request_id -> {"line": request line or None, "events": [msg, ...]}"""
    idx = {}
    for ln in logs:
        if ln.get("msg") == "request":
            rid = ln.get("request_id")
            if rid:
                idx.setdefault(rid, {"line": None, "events": []})["line"] = ln
        else:
            rid = _rid_of(ln.get("detail"))
            if rid:
                ent = idx.setdefault(rid, {"line": None, "events": []})
                ent["events"].append(ln.get("msg", ""))
                if ln.get("msg", "").startswith("could not record"):
                    ent["record_failed_at"] = log_time(ln)
    return idx


def explain_repeat(prev, cur, log_idx, exits, port_inst,
                   release_statuses=RELEASE_STATUSES, chaos=(), lease_s=None):
    """Why the upstream may have seen cur after prev (same key): returns
    (explanation or None, note)."""
    ent = log_idx.get(prev.get("rid")) or {"line": None, "events": []}
    ln = ent["line"]
    events = ent["events"]
    if any(e.startswith("upstream outcome unknown") for e in events):
        return "unknown outcome", ""
    if ln is not None:
        if ln.get("outcome") == "outcome_unknown":
            return "unknown outcome", ""
        if ln.get("outcome") == "forwarded" and ln.get("status") in release_statuses:
            return "released (%d)" % ln["status"], ""
        note = "the proxy logged outcome=%s status=%s for it" % (
            ln.get("outcome"), ln.get("status"))
        if any(e.startswith("could not record") for e in events):
            if long_outage(ent.get("record_failed_at"), chaos, lease_s):
                return "store down longer than the lease while recording", ""
            note += " and could not record it (record_failed: the known outcome was lost)"
        if any(e.startswith("attempt lost its lease") for e in events):
            note += " and was fenced"
        return None, note
    inst = port_inst.get(prev.get("port"))
    for e in exits:
        # the upstream reads a request a moment after the proxy sent it:
        # a process that ended up to UPSTREAM_LAG_S before it arrived may
        # have sent it, and died without answering or logging it
        if e.get("inst") == inst and prev["start"] - UPSTREAM_LAG_S <= e["t"] <= cur["start"]:
            return "crash (%s of proxy %s)" % (e.get("why") or e.get("rc"), inst), ""
    return None, "no log line for request_id %s and no exit of proxy %s after it" % (
        prev.get("rid"), inst)


def check_repeats_explained(ups, logs, exits, port_inst, ttl_by_target=None,
                            release_statuses=RELEASE_STATUSES, first_try=None, chaos=(),
                            lease_s=None):
    """Every repeat of a key at the upstream follows a logged release, an
    unknown outcome or a crash (or, on a route with a short ttl, the
    record's expiry: ttl_by_target maps a target to its ttl in seconds;
    first_try maps a key to its first client request, before any claim)."""
    v = []
    idx = index_logs(logs)
    for key, rs in by_key(ups).items():
        gen_start = min(rs[0]["start"], (first_try or {}).get(key, rs[0]["start"]))
        for prev, cur in zip(rs, rs[1:]):
            ttl = (ttl_by_target or {}).get(cur["target"])
            if ttl is not None and cur["start"] - gen_start > ttl:
                gen_start = cur["start"]   # the record expired: a new key
                continue
            why, note = explain_repeat(prev, cur, idx, exits, port_inst, release_statuses,
                                       chaos, lease_s)
            if why is None:
                v.append(("repeats_explained", "key %s: %s%s repeated %s%s unexplained: %s"
                          % (key, _short(cur), proxy_said(cur, idx), _short(prev),
                             proxy_said(prev, idx), note)))
    return v


def check_takeover_after_lease(ups, attempts, logs, lease_s,
                               release_statuses=RELEASE_STATUSES):
    """A key is executed again only after the lease of the attempt that
    sent it before had ended, unless that attempt was answered with a
    status that releases the key. The attempt claimed the key after its
    client sent the request (t0), so its lease ran at least until t0 +
    lease: a repeat that reached the upstream before that was sent while
    the lease was alive."""
    v = []
    idx = index_logs(logs)
    sent_at = {a["rid"]: a["t0"] for a in attempts if a.get("rid")}
    for key, rs in by_key(ups).items():
        for prev, cur in zip(rs, rs[1:]):
            ln = (idx.get(prev.get("rid")) or {}).get("line") or {}
            if ln.get("outcome") == "forwarded" and ln.get("status") in release_statuses:
                continue
            if prev.get("status") in release_statuses and prev.get("answered"):
                continue
            t0 = sent_at.get(prev.get("rid"))
            if t0 is None or lease_s is None:
                continue
            if cur["start"] < t0 + lease_s - 0.05:
                v.append(("takeover_after_lease", "key %s: %s%s reached the upstream %.2f s"
                          " after the request of %s%s was sent, inside its %.1f s lease" % (
                              key, _short(cur), proxy_said(cur, idx), cur["start"] - t0,
                              _short(prev), proxy_said(prev, idx), lease_s)))
    return v


# --- stalls --------------------------------------------------------------------

REPLAY_STALLS = ("hold_answer", "hold_statement", "hold_all", "dns", "log")


def _overlaps(a0, a1, b0, b1):
    return a0 < b1 and b0 < a1


def replay_latencies(chaos, samples, during):
    """Latencies (seconds; None for a transport error) of the prober's
    warm replays that overlapped a store outage or a stall of the store or
    the log (during=True), or none of them (False); a replay on a proxy
    that was being killed, stopped or frozen meanwhile counts in neither."""
    windows = [(e.get("stall") or e["kind"], e.get("inst"), e["t"], e["t_end"]) for e in chaos
               if e.get("t_end") is not None and (
                   e["kind"] == "pg_restart" or (e["kind"] == "stall" and
                                                 e["stall"] in REPLAY_STALLS and
                                                 e.get("started", True)))]
    away = [(e["inst"], e["t"], e["t_end"]) for e in chaos if e.get("t_end") is not None and (
        e["kind"] in ("kill", "term") or e.get("stall") == "freeze")]
    out = []
    for a in samples:
        if not a.get("warm") or a.get("t1") is None:
            continue
        if any(i == a["inst"] and _overlaps(a["t0"] - 0.5, a["t1"], t0, t1)
               for i, t0, t1 in away):
            continue
        over = ["%s%s" % (k, " of " + i if i else "") for k, i, t0, t1 in windows
                if _overlaps(a["t0"], a["t1"], t0, t1)]
        if bool(over) == during:
            out.append((dict(a, stalls=over), None if a.get("error") else a["t1"] - a["t0"]))
    return out


def latency_line(lat):
    ok = sorted(x for _, x in lat if x is not None)
    if not lat:
        return "no samples"
    if not ok:
        return "%d samples, all transport errors" % len(lat)

    def q(p):
        return ok[min(len(ok) - 1, int(p * len(ok)))] * 1000
    return "%d samples, p50 %.1f ms, p99 %.1f ms, max %.1f ms%s" % (
        len(lat), q(0.5), q(0.99), ok[-1] * 1000,
        ", %d transport errors" % (len(lat) - len(ok)) if len(ok) < len(lat) else "")


def check_replays_answer(chaos, samples, bound_s):
    """A replay of an answer the proxy holds in its cache comes back
    within bound_s while the store or the log stalls: it needs neither."""
    v = []
    for a, lat in replay_latencies(chaos, samples, True):
        if lat is None or lat > bound_s:
            v.append(("replay_during_stall", "key %s: a replay from %s's cache during %s "
                      "%s (rid %s, at %.3f)" % (
                          a["key"], a["inst"], ", ".join(a["stalls"]),
                          "failed: %s" % a["error"] if lat is None
                          else "took %.2f s (bound %.1f s)" % (lat, bound_s),
                          a.get("rid"), a["t0"])))
    return v


def check_readyz_frozen(chaos, stall_max_s, margin_s=1.0):
    """While a proxy's serving thread is frozen longer than loop_stall_max,
    /readyz on its admin listener answers something else than 200."""
    v = []
    for e in chaos:
        if e.get("stall") != "freeze":
            continue
        if e.get("error"):
            v.append(("stall_injected", "the freeze of %s failed: %s" % (e["inst"],
                                                                       e["error"])))
            continue
        t0, t1 = e["frozen_at"] + stall_max_s + margin_s, e["thawed_at"] - 0.1
        if t1 <= t0:
            continue
        seen = [q for q in e["polls"] if t0 <= q["t"] <= t1]
        if not seen or all(q["status"] == 200 for q in seen):
            v.append(("readyz_sees_frozen_loop", "%s's serving thread was frozen %.1f s; "
                      "/readyz answered %s from %.1f s on" % (
                          e["inst"], e["thawed_at"] - e["frozen_at"],
                          ", ".join(str(q["status"]) for q in seen) or "nothing",
                          stall_max_s + margin_s)))
    return v


def check_stalls(chaos, samples, replay_bound_s, stall_max_s):
    return check_replays_answer(chaos, samples, replay_bound_s) + \
        check_readyz_frozen(chaos, stall_max_s)


# --- both modes ---------------------------------------------------------------

def key_results(rs, dedup):
    """The ids the upstream answered for a key: its first effect's (dedup),
    or every execution's."""
    if dedup:
        return {r["result_id"] for r in rs if r.get("effect") and r.get("result_id")}
    return {r["result_id"] for r in rs if r.get("result_id")}


def check_answers_carry_result(attempts, ups, dedup):
    """Every 201/402 a client got for a key carries that key's one upstream
    result, whole: the key's id, one Content-Type, no trailer fields as
    headers, a body the client can read."""
    v = []
    per_key = by_key(ups)
    seen = {}
    for a in attempts:
        if a.get("status") not in FINAL_UPSTREAM or a.get("code"):
            continue
        key = a["key"]
        what = "key %s: %s answer %d%s (rid %s)" % (
            key, a["kind"], a["status"], " (replayed)" if a.get("replayed") else "",
            a.get("rid"))
        if not a.get("decodable"):
            v.append(("answer_readable", what + " has a body that is not readable JSON"
                      " (content coding lost?)"))
            continue
        if a.get("ctypes", 1) != 1:
            v.append(("answer_headers", what + " has %d Content-Type headers" % a["ctypes"]))
        if a.get("trailer"):
            v.append(("answer_headers", what + " carries trailer fields as headers"))
        res = key_results(per_key.get(key, []), dedup)
        if a.get("body_key") != key or a.get("id") not in res:
            v.append(("answer_is_result", what + " carries id %s for key %s; the upstream's"
                      " result for this key is %s" % (a.get("id"), a.get("body_key"),
                                                      sorted(res) or "none")))
            continue
        first = seen.setdefault(key, a["id"])
        if a["id"] != first:
            v.append(("answer_is_result", what + " carries %s, an earlier answer %s"
                      % (a["id"], first)))
    return v


def check_bodies(ups, keys):
    """What reached the upstream under a key is that key's one body: no
    probe body, no body of another key, no key the clients never used."""
    v = []
    for r in ups:
        key = r.get("key")
        if key is None:
            if r["method"] == "POST" and r["target"].startswith("/v1/"):
                v.append(("body_as_claimed", "a POST without a key reached the upstream: "
                          + _short(r)))
            continue
        k = keys.get(key)
        if k is None:
            v.append(("body_as_claimed", "unknown key %r reached the upstream: %s"
                      % (key, _short(r))))
        elif r["body"] != k["body"]:
            probe = r["body"] in k.get("probes", ())
            v.append(("body_as_claimed", "key %s: the upstream received %s: %s" % (
                key, "the mismatched probe body" if probe else "another body %r" % r["body"][:80],
                _short(r))))
        elif k.get("route") and not r["target"].startswith(k["route"]):
            v.append(("body_as_claimed", "key %s was sent to %s, received on %s"
                      % (key, k["route"], r["target"])))
    return v


def check_probes(flows):
    """A probe (another body under a used key) is refused as a mismatch."""
    v = []
    for f in flows:
        if f["kind"] == "probe" and f.get("final") and f.get("cause") != "mismatch":
            v.append(("probe_refused", "key %s: a probe with another body got %s, not a "
                      "mismatch" % (f["key"], f.get("cause"))))
    return v


def check_same_body_never_mismatch(attempts):
    v = []
    for a in attempts:
        if a["kind"] != "probe" and a.get("code") == "idempotency_key_mismatch":
            v.append(("same_body_not_mismatch", "key %s: a retry with its own body got "
                      "a mismatch (rid %s)" % (a["key"], a.get("rid"))))
    return v


def records_failed(logs, chaos, lease_s):
    """Keys whose record the proxy could not write, and those of them whose
    write failed while the store was down longer than the lease (no retry
    within the lease could have written them)."""
    failed, excused = set(), set()
    for ln in logs:
        if (ln.get("msg") or "").startswith("could not record"):
            m = re.search(r"key=(\S+)", ln.get("detail") or "")
            if m:
                failed.add(m.group(1))
                if long_outage(log_time(ln), chaos, lease_s):
                    excused.add(m.group(1))
    return failed, excused


def expired_keys(ups, ttl_by_target):
    """Keys sent upstream again after their record's ttl (a short-ttl
    route): from then on the key is a new one, with answers of its own."""
    out = set()
    for key, rs in by_key(ups).items():
        ttl = (ttl_by_target or {}).get(rs[0]["target"])
        if ttl is not None and any(r["start"] - rs[0]["start"] > ttl for r in rs[1:]):
            out.add(key)
    return out


def check_known_outcome_kept(flows, logs=(), chaos=(), lease_s=None, ups=(),
                             ttl_by_target=None):
    """Once a client had its final answer, the same request again gets it
    replayed: it is never stuck behind 409 (the record lost the answer),
    unless the store was down for longer than the lease just then, or the
    record expired (ttl) and the key was sent again as a new one."""
    v = []
    failed, excused = records_failed(logs, chaos, lease_s)
    excused |= expired_keys(ups, ttl_by_target)
    for f in flows:
        if f["key"] in excused:
            continue
        if f["kind"] == "replay" and not f.get("final") and f.get("cause") in ("in_use", "held"):
            v.append(("known_outcome_kept", "key %s: after a final answer, the same request"
                      " got 409 %s until the client gave up%s" % (
                          f["key"], f["cause"], " (the proxy logged record_failed for it)"
                          if f["key"] in failed else "")))
    return v


def check_held_explained(flows, attempts, ups, logs=(), chaos=(), lease_s=None):
    """A key held (on_unknown = hold) had an attempt with an unknown
    outcome: an upstream request that was not answered, a client attempt
    that met a crash or a store outage, or an answer the proxy could not
    record while the store was down for longer than the lease (the client
    had its answer; the record stays processing, and so held)."""
    v = []
    _, unrecordable = records_failed(logs, chaos, lease_s)
    per_key = by_key(ups)
    tried = {}
    for a in attempts:
        tried.setdefault(a["key"], []).append(a)
    for f in flows:
        if f.get("final") or f.get("cause") != "held":
            continue
        key = f["key"]
        if key in unrecordable:
            continue
        unanswered = [r for r in per_key.get(key, []) if not r.get("answered")]
        troubled = [a for a in tried.get(key, []) if a.get("error")
                    or a.get("code") in ("idempotency_store_unavailable",
                                         "upstream_outcome_unknown")]
        if not unanswered and not troubled:
            got = per_key.get(key, [])
            v.append(("held_explained", "key %s is held, but %s" % (
                key, "its one upstream request was answered (%s)" % _short(got[0]) if got
                else "nothing was sent upstream and no attempt met a crash or outage")))
    return v


def check_proxies(exits):
    v = []
    for e in exits:
        if not e.get("expected"):
            v.append(("proxy_survives", "proxy %s died unasked: %s" % (e["inst"], e["why"])))
        elif e.get("signal") == "TERM" and e.get("rc") != 0:
            v.append(("proxy_survives", "proxy %s exited %s after SIGTERM (expected 0)"
                      % (e["inst"], e.get("rc"))))
    return v


def check_run(mode, ups, attempts, flows, keys, logs, chaos, exits, port_inst,
              ttl_by_target=None, lease_s=None):
    """All the invariants of one mode ("hold" or "release")."""
    v = []
    dedup = mode == "release"
    if mode == "hold":
        v += check_one_request_per_key(ups)
        v += check_held_explained(flows, attempts, ups, logs, chaos, lease_s)
    else:
        v += check_one_effect_per_key(ups)
        first_try = {}
        for a in attempts:
            first_try[a["key"]] = min(a["t0"], first_try.get(a["key"], a["t0"]))
        v += check_no_overlap(ups, logs)
        v += check_repeats_explained(ups, logs, exits, port_inst, ttl_by_target,
                                     first_try=first_try, chaos=chaos, lease_s=lease_s)
        v += check_takeover_after_lease(ups, attempts, logs, lease_s)
    v += check_answers_carry_result(attempts, ups, dedup)
    v += check_bodies(ups, keys)
    v += check_probes(flows)
    v += check_same_body_never_mismatch(attempts)
    v += check_known_outcome_kept(flows, logs, chaos, lease_s, ups, ttl_by_target)
    v += check_proxies(exits)
    return v


# --- the HTTP front-end fuzzer's oracles ---------------------------------------

UNRESERVED = re.compile(r"%(?:4[1-9A-Fa-f]|5[0-9Aa]|6[1-9A-Fa-f]|7[0-9Aa]|3[0-9]|2[Dd]|2[Ee]|5[Ff]|7[Ee])")


def normalise_path(target):
    """The path an upstream application acts on: fragment and query cut,
    percent-encoded unreserved characters decoded (RFC 3986 6.2.2.2), dot
    segments removed, a trailing slash dropped."""
    path = target.split("#", 1)[0].split("?", 1)[0]
    path = UNRESERVED.sub(lambda m: chr(int(m.group(0)[1:], 16)), path)
    out = []
    for seg in path.split("/")[1:]:
        if seg == ".":
            continue
        if seg == "..":
            if out:
                out.pop()
            continue
        out.append(seg)
    path = "/" + "/".join(out)
    if len(path) > 1 and path.endswith("/"):
        path = path.rstrip("/") or "/"
    return path


def match_route(routes, method, target):
    """The first route (dicts: name, path, methods, key) whose template
    matches what the upstream received, as an application would read it;
    returns (route or None, protected)."""
    path = normalise_path(target)
    segs = path.split("/")[1:] if path != "/" else []
    for r in routes:
        t = r["path"]
        rest = t.endswith("/*")
        tsegs = (t[:-2] if rest else t).split("/")[1:]
        if tsegs == [""]:
            tsegs = []
        if len(segs) < len(tsegs) or (not rest and len(segs) != len(tsegs)):
            continue
        if all(ts == s or (ts.startswith("{") and s) for ts, s in zip(tsegs, segs)):
            return r, method.upper() in r.get("methods", ("POST", "PATCH"))
    return None, False


def parse_key(raw):
    """The key an Idempotency-Key value names: the bare token or the
    sf-string, without parameters."""
    if raw is None:
        return None
    v = raw.strip()
    if v.startswith('"'):
        m = re.match(r'"((?:[^"\\]|\\.)*)"', v)
        return re.sub(r"\\(.)", r"\1", m.group(1)) if m else v
    return v.split(";", 1)[0].strip()


PROXY_HEADERS = frozenset(["host", "x-forwarded-for", "x-forwarded-proto",
                           "x-forwarded-host", "x-request-id", "content-length",
                           "idempotency-key", "accept", "expect", "transfer-encoding",
                           "connection"])


def sent_header_set(raw_requests):
    """(lower-case name, value) of every header line in the raw bytes sent,
    values also cut at a NUL (libmicrohttpd ends a value there)."""
    out = set()
    for raw in raw_requests:
        # every line, not only the first head: pipelined requests too
        for ln in raw.split(b"\n"):
            ln = ln.rstrip(b"\r")
            if b":" not in ln or ln[:1] in (b" ", b"\t"):
                continue
            n, _, val = ln.partition(b":")
            n = n.decode("latin-1").lower()
            val = val.decode("latin-1")
            out.add((n, val.strip(" \t")))
            out.add((n, val.split("\0", 1)[0].strip(" \t")))
    return out


def _canon(body):
    def no_dups(pairs):
        d = {}
        for k, x in pairs:
            if k in d:
                raise ValueError("duplicate key")
            d[k] = x
        return d
    try:
        return ("json", json.dumps(json.loads(body, object_pairs_hook=no_dups),
                                   sort_keys=True, separators=(",", ":")))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return ("raw", body)


def check_fuzz(ups, records, routes, sent_headers):
    """ups: what the fuzz upstream received (method, target, headers as
    [(name, value)], body); records: {(operation, key): tenant} from
    PostgreSQL; routes: the proxy's routes; sent_headers: sent_header_set().
    Nothing may reach the upstream that differs from what was claimed."""
    v = []
    claimed = {}
    for r in ups:
        route, protected = match_route(routes, r["method"], r["target"])
        what = "%s %s" % (r["method"], r["target"])
        if route is None:
            v.append(("fuzz_routed", "%s reached the upstream but matches no route" % what))
            continue
        hdrs = r["headers"]
        for n, val in hdrs:
            if n.lower() not in PROXY_HEADERS and (n.lower(), val.strip(" \t")) not in sent_headers:
                v.append(("fuzz_headers_as_sent", "%s: header %r: %r reached the upstream but"
                          " was never sent as a header line" % (what, n, val)))
        keys = [val for n, val in hdrs if n.lower() == "idempotency-key"]
        if not protected:
            continue
        if not keys:
            if route.get("key", "required") == "required":
                v.append(("fuzz_key_required", "%s reached the upstream without a key "
                          "(route %s requires one); it carried %s" % (
                              what, route["name"], [n for n, _ in hdrs])))
            continue
        if len(keys) > 1:
            v.append(("fuzz_claimed", "%s reached the upstream with %d keys" % (what, len(keys))))
        key = parse_key(keys[0])
        if (route["name"], key) not in records:
            ops = sorted(op for op, k in records if k == key)
            v.append(("fuzz_claimed", "%s with key %r reached the upstream; it matches "
                      "route %s but the key's record is under %s" % (
                          what, key, route["name"], ops or "no operation")))
            continue
        # one claim per tenant: the tenant header as received names it
        src = {"authorization": "authorization"}.get(route.get("tenant", ""), None)
        if route.get("tenant", "").startswith("header:"):
            src = route["tenant"][len("header:"):].lower()
        tenant = tuple(val for n, val in hdrs if src and n.lower() == src)
        prev = claimed.setdefault((route["name"], tenant, key), r)
        if prev is not r and (prev["method"] != r["method"] or prev["target"] != r["target"]
                              or _canon(prev["body"]) != _canon(r["body"])):
            v.append(("fuzz_claimed", "key %r on route %s reached the upstream twice with "
                      "different requests: %s %s %r and %s %r" % (
                          key, route["name"], prev["method"], prev["target"],
                          prev["body"][:60], what, r["body"][:60])))
    return v
