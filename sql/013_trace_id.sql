-- The trace that made a record's first attempt: the trace id of that
-- request's W3C traceparent (16 bytes), NULL when it carried none that is
-- valid. The admin API shows it (hex), so that an operator can go from a
-- key to the trace of the request the upstream executed.
--
-- Adding a nullable column without a default rewrites nothing. It has no
-- constraint: only the proxy writes it, 16 bytes or NULL. A domain with
-- CHECK (octet_length(VALUE) = 16), as 008 does for state, cost a first
-- attempt (claim and record) 0.7 % more of the server's instructions than
-- the plain column (tests/bench/cg_store.sh: 320,288 per transaction
-- before this migration, 323,412 with the plain column and a trace id,
-- 325,593 with the domain).
ALTER TABLE idempotency_records ADD COLUMN trace_id bytea;

-- idem_claim with a tenth argument, p_trace (012's function otherwise):
-- the trace id written with a fresh key, or with an expired one claimed
-- anew (a new record). A takeover keeps the first attempt's trace id, like
-- created_at: the trace of each later attempt is in its own log lines.
--
-- The eight- and nine-argument idem_claim stay, as wrappers that store no
-- trace id: instances of an earlier version call them until they are
-- replaced (a rolling upgrade). On Citus --migrate distributes the new
-- overload with the records, as every overload (store_pg_schema.c).
CREATE OR REPLACE FUNCTION idem_claim(p_tenant text, p_operation text, p_key text,
                           p_hash bytea, p_lease_ms bigint, p_ttl_ms bigint,
                           p_hold boolean, p_owner uuid, p_retain_ms bigint,
                           p_trace bytea)
RETURNS TABLE (o_decision text, o_owner uuid, o_attempt integer,
               o_lease_ms bigint, o_status integer, o_headers bytea,
               o_body bytea, o_replayable boolean, o_expires_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    r         idempotency_records%ROWTYPE;
    v_attempt integer;
    v_expires timestamptz;
    v_lease   interval := p_lease_ms * interval '1 millisecond';
    -- A variable, not now() in the CASE below: Citus refuses non-immutable
    -- functions in a CASE of a distributed UPDATE.
    v_lease_end timestamptz := now() + v_lease;
    v_ttl     interval := greatest(p_ttl_ms, p_lease_ms)
                         * interval '1 millisecond';
    v_keep    interval := greatest(p_retain_ms, p_ttl_ms, p_lease_ms)
                         * interval '1 millisecond';
    v_replay  timestamptz := CASE WHEN p_retain_ms > p_ttl_ms
                                  THEN now() + v_ttl END;
    v_ttl_ms  bigint := floor(extract(epoch FROM v_ttl) * 1000)::bigint;
BEGIN
    -- A fresh key: one insert, nothing read first.
    INSERT INTO idempotency_records AS t
           (tenant, operation, idem_key, request_hash, state,
            owner_token, attempt, lease_until, hold_on_unknown,
            created_at, updated_at, expires_at, replay_until, trace_id)
    VALUES (p_tenant, p_operation, p_key, p_hash, 'processing',
            p_owner, 1, now() + v_lease, p_hold,
            now(), now(), now() + v_keep, v_replay, p_trace)
    ON CONFLICT DO NOTHING;
    IF FOUND THEN
        o_decision := 'forward'; o_owner := p_owner; o_attempt := 1;
        o_lease_ms := p_lease_ms;
        o_expires_ms := v_ttl_ms;
        RETURN NEXT;
        RETURN;
    END IF;
    FOR i IN 1..10 LOOP
        SELECT * INTO r FROM idempotency_records t
         WHERE t.tenant = p_tenant AND t.operation = p_operation
           AND t.idem_key = p_key;

        IF NOT FOUND THEN
            INSERT INTO idempotency_records AS t
                   (tenant, operation, idem_key, request_hash, state,
                    owner_token, attempt, lease_until, hold_on_unknown,
                    created_at, updated_at, expires_at, replay_until, trace_id)
            VALUES (p_tenant, p_operation, p_key, p_hash, 'processing',
                    p_owner, 1, now() + v_lease, p_hold,
                    now(), now(), now() + v_keep, v_replay, p_trace)
            ON CONFLICT DO NOTHING;
            IF FOUND THEN
                RETURN QUERY SELECT 'forward'::text, p_owner, 1, p_lease_ms,
                    NULL::integer, NULL::bytea, NULL::bytea, NULL::boolean,
                    v_ttl_ms;
                RETURN;
            END IF;
            CONTINUE;   -- a concurrent attempt inserted first: read it
        END IF;

        IF r.state = 'processing' AND r.owner_token = p_owner
           AND r.lease_until > now() THEN
            -- A repeated claim whose lease lives (as in 009).
            RETURN QUERY SELECT
                CASE WHEN r.attempt = 1 THEN 'forward' ELSE 'takeover' END,
                p_owner, r.attempt,
                floor(extract(epoch FROM r.lease_until - now())
                      * 1000)::bigint,
                NULL::integer, NULL::bytea, NULL::bytea, NULL::boolean,
                floor(extract(epoch FROM coalesce(r.replay_until,
                      r.expires_at) - now()) * 1000)::bigint;
            RETURN;
        END IF;

        IF r.state = 'processing' AND r.owner_token = p_owner THEN
            -- A repeated claim whose lease ended: renewed under its own
            -- token (as in 009); the response lives at least as long.
            UPDATE idempotency_records t
               SET lease_until = now() + v_lease, updated_at = now(),
                   expires_at = greatest(t.expires_at, now() + v_lease),
                   replay_until = CASE WHEN t.replay_until IS NOT NULL
                       THEN greatest(t.replay_until, v_lease_end) END
             WHERE t.tenant = p_tenant AND t.operation = p_operation
               AND t.idem_key = p_key AND t.owner_token = p_owner
               AND t.state = 'processing'
            RETURNING t.attempt, coalesce(t.replay_until, t.expires_at)
                 INTO v_attempt, v_expires;
            IF FOUND THEN
                RETURN QUERY SELECT
                    CASE WHEN v_attempt = 1 THEN 'forward' ELSE 'takeover' END,
                    p_owner, v_attempt, p_lease_ms,
                    NULL::integer, NULL::bytea, NULL::bytea, NULL::boolean,
                    floor(extract(epoch FROM v_expires - now()) * 1000)::bigint;
                RETURN;
            END IF;
            CONTINUE;
        END IF;

        IF r.state = 'completed' AND r.expires_at > now()
           AND coalesce(r.replay_until, r.expires_at) <= now() THEN
            -- A tombstone: its response is gone (or going), its key is
            -- kept. Never forwarded; another payload is still a mismatch.
            RETURN QUERY SELECT
                CASE WHEN r.request_hash <> p_hash THEN 'mismatch'
                     ELSE 'expired' END,
                NULL::uuid, r.attempt, 0::bigint, r.response_status,
                NULL::bytea, NULL::bytea, NULL::boolean,
                floor(extract(epoch FROM r.expires_at - now()) * 1000)::bigint;
            RETURN;
        END IF;

        IF coalesce(r.replay_until, r.expires_at) <= now()
           AND NOT (r.state = 'processing' AND r.lease_until > now()) THEN
            -- Past the end of its response and not a tombstone: counts
            -- as absent, as an expired row always did.
            UPDATE idempotency_records t
               SET request_hash = p_hash, state = 'processing',
                   owner_token = p_owner, attempt = 1,
                   lease_until = now() + v_lease, hold_on_unknown = p_hold,
                   response_status = NULL, response_headers = NULL,
                   response_body = NULL, replayable = NULL,
                   created_at = now(), updated_at = now(),
                   expires_at = now() + v_keep, replay_until = v_replay,
                   trace_id = p_trace
             WHERE t.tenant = p_tenant AND t.operation = p_operation
               AND t.idem_key = p_key AND t.owner_token = r.owner_token
               AND coalesce(t.replay_until, t.expires_at) <= now()
               AND NOT (t.state = 'completed' AND t.expires_at > now())
               AND NOT (t.state = 'processing' AND t.lease_until > now());
            IF FOUND THEN
                RETURN QUERY SELECT 'forward'::text, p_owner, 1, p_lease_ms,
                    NULL::integer, NULL::bytea, NULL::bytea, NULL::boolean,
                    v_ttl_ms;
                RETURN;
            END IF;
            CONTINUE;
        END IF;

        IF r.request_hash <> p_hash THEN
            RETURN QUERY SELECT 'mismatch'::text, NULL::uuid, r.attempt,
                0::bigint, NULL::integer, NULL::bytea, NULL::bytea,
                NULL::boolean, 0::bigint;
            RETURN;
        END IF;

        IF r.state = 'completed' THEN
            RETURN QUERY SELECT 'replay'::text, NULL::uuid, r.attempt, 0::bigint,
                r.response_status, r.response_headers, r.response_body,
                r.replayable,
                floor(extract(epoch FROM coalesce(r.replay_until,
                      r.expires_at) - now()) * 1000)::bigint;
            RETURN;
        END IF;

        IF r.state = 'processing' AND r.lease_until > now() THEN
            RETURN QUERY SELECT 'in_flight'::text, NULL::uuid, r.attempt,
                ceil(extract(epoch FROM r.lease_until - now()) * 1000)::bigint,
                NULL::integer, NULL::bytea, NULL::bytea, NULL::boolean,
                0::bigint;
            RETURN;
        END IF;

        IF r.state = 'processing' AND r.hold_on_unknown THEN
            RETURN QUERY SELECT 'held'::text, NULL::uuid, r.attempt, 0::bigint,
                NULL::integer, NULL::bytea, NULL::bytea, NULL::boolean,
                0::bigint;
            RETURN;
        END IF;

        -- Released, or processing with a dead lease: take over. The record
        -- and its response live at least as long as the new lease.
        UPDATE idempotency_records t
           SET state = 'processing', owner_token = p_owner,
               attempt = t.attempt + 1, lease_until = now() + v_lease,
               hold_on_unknown = p_hold, updated_at = now(),
               expires_at = greatest(t.expires_at, now() + v_lease),
               replay_until = CASE WHEN t.replay_until IS NOT NULL
                   THEN greatest(t.replay_until, v_lease_end) END
         WHERE t.tenant = p_tenant AND t.operation = p_operation
           AND t.idem_key = p_key AND t.owner_token = r.owner_token
           AND t.state = r.state
           AND coalesce(t.replay_until, t.expires_at) > now()
        RETURNING t.attempt, coalesce(t.replay_until, t.expires_at)
             INTO v_attempt, v_expires;
        IF FOUND THEN
            RETURN QUERY SELECT 'takeover'::text, p_owner, v_attempt,
                p_lease_ms, NULL::integer, NULL::bytea, NULL::bytea,
                NULL::boolean,
                floor(extract(epoch FROM v_expires - now()) * 1000)::bigint;
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'idem_claim: key % kept changing under contention', p_key
        USING ERRCODE = '40001';
END
$$;

-- 012's overload, now this one without a trace id: one body to keep.
CREATE OR REPLACE FUNCTION idem_claim(p_tenant text, p_operation text, p_key text,
                           p_hash bytea, p_lease_ms bigint, p_ttl_ms bigint,
                           p_hold boolean, p_owner uuid, p_retain_ms bigint)
RETURNS TABLE (o_decision text, o_owner uuid, o_attempt integer,
               o_lease_ms bigint, o_status integer, o_headers bytea,
               o_body bytea, o_replayable boolean, o_expires_ms bigint)
LANGUAGE sql VOLATILE AS $$
    SELECT * FROM idem_claim(p_tenant, p_operation, p_key, p_hash,
                             p_lease_ms, p_ttl_ms, p_hold, p_owner,
                             p_retain_ms, NULL::bytea)
$$;
