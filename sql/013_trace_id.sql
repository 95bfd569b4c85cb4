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

-- idem_claim with a ninth argument, p_trace: the trace id written with a
-- fresh key, or with an expired one claimed anew (a new record). A
-- takeover keeps the first attempt's trace id, like created_at: the trace
-- of each later attempt is in its own log lines.
--
-- The eight-argument idem_claim stays: instances of the version before
-- this one call it until they are replaced (a rolling upgrade), and their
-- claims store no trace id. On Citus --migrate distributes the new
-- overload with the records, as every overload (store_pg_schema.c).
CREATE OR REPLACE FUNCTION idem_claim(p_tenant text, p_operation text, p_key text,
                           p_hash bytea, p_lease_ms bigint, p_ttl_ms bigint,
                           p_hold boolean, p_owner uuid, p_trace bytea)
RETURNS TABLE (o_decision text, o_owner uuid, o_attempt integer,
               o_lease_ms bigint, o_status integer, o_headers bytea,
               o_body bytea, o_replayable boolean, o_expires_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    r         idempotency_records%ROWTYPE;
    v_attempt integer;
    v_expires timestamptz;
    v_lease   interval := p_lease_ms * interval '1 millisecond';
    v_ttl     interval := greatest(p_ttl_ms, p_lease_ms)
                         * interval '1 millisecond';
BEGIN
    -- A fresh key: one insert, nothing read first.
    INSERT INTO idempotency_records AS t
           (tenant, operation, idem_key, request_hash, state,
            owner_token, attempt, lease_until, hold_on_unknown,
            created_at, updated_at, expires_at, trace_id)
    VALUES (p_tenant, p_operation, p_key, p_hash, 'processing',
            p_owner, 1, now() + v_lease, p_hold,
            now(), now(), now() + v_ttl, p_trace)
    ON CONFLICT DO NOTHING;
    IF FOUND THEN
        o_decision := 'forward'; o_owner := p_owner; o_attempt := 1;
        o_lease_ms := p_lease_ms;
        o_expires_ms := floor(extract(epoch FROM v_ttl) * 1000)::bigint;
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
                    created_at, updated_at, expires_at, trace_id)
            VALUES (p_tenant, p_operation, p_key, p_hash, 'processing',
                    p_owner, 1, now() + v_lease, p_hold,
                    now(), now(), now() + v_ttl, p_trace)
            ON CONFLICT DO NOTHING;
            IF FOUND THEN
                RETURN QUERY SELECT 'forward'::text, p_owner, 1, p_lease_ms,
                    NULL::integer, NULL::bytea, NULL::bytea, NULL::boolean,
                    floor(extract(epoch FROM v_ttl) * 1000)::bigint;
                RETURN;
            END IF;
            CONTINUE;   -- a concurrent attempt inserted first: read it
        END IF;

        IF r.state = 'processing' AND r.owner_token = p_owner
           AND r.lease_until > now() THEN
            -- This very attempt claimed the key already (a repeated claim)
            -- and its lease lives: it carries on with what is left of it
            -- (rounded down, so the proxy never counts on more).
            RETURN QUERY SELECT
                CASE WHEN r.attempt = 1 THEN 'forward' ELSE 'takeover' END,
                p_owner, r.attempt,
                floor(extract(epoch FROM r.lease_until - now())
                      * 1000)::bigint,
                NULL::integer, NULL::bytea, NULL::bytea, NULL::boolean,
                floor(extract(epoch FROM r.expires_at - now()) * 1000)::bigint;
            RETURN;
        END IF;

        IF r.state = 'processing' AND r.owner_token = p_owner THEN
            -- Its lease ended before the repeat came: it may carry on only
            -- with a new one, written under its own token. Nothing was sent
            -- for it (the proxy sends only after the claim's answer), and
            -- while the row is still processing under its token nobody
            -- else took the key. An UPDATE that finds nothing means someone
            -- did (or the reaper released it): read again and answer as the
            -- row says, never "forward" on a lease that has ended.
            UPDATE idempotency_records t
               SET lease_until = now() + v_lease, updated_at = now(),
                   expires_at = greatest(t.expires_at, now() + v_lease)
             WHERE t.tenant = p_tenant AND t.operation = p_operation
               AND t.idem_key = p_key AND t.owner_token = p_owner
               AND t.state = 'processing'
            RETURNING t.attempt, t.expires_at INTO v_attempt, v_expires;
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

        IF r.expires_at <= now()
           AND NOT (r.state = 'processing' AND r.lease_until > now()) THEN
            -- Expired but not yet purged: counts as absent.
            UPDATE idempotency_records t
               SET request_hash = p_hash, state = 'processing',
                   owner_token = p_owner, attempt = 1,
                   lease_until = now() + v_lease, hold_on_unknown = p_hold,
                   response_status = NULL, response_headers = NULL,
                   response_body = NULL, replayable = NULL,
                   created_at = now(), updated_at = now(),
                   expires_at = now() + v_ttl, trace_id = p_trace
             WHERE t.tenant = p_tenant AND t.operation = p_operation
               AND t.idem_key = p_key AND t.owner_token = r.owner_token
               AND t.expires_at <= now()
               AND NOT (t.state = 'processing' AND t.lease_until > now());
            IF FOUND THEN
                RETURN QUERY SELECT 'forward'::text, p_owner, 1, p_lease_ms,
                    NULL::integer, NULL::bytea, NULL::bytea, NULL::boolean,
                    floor(extract(epoch FROM v_ttl) * 1000)::bigint;
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
                floor(extract(epoch FROM r.expires_at - now()) * 1000)::bigint;
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
        -- lives at least as long as the new lease.
        UPDATE idempotency_records t
           SET state = 'processing', owner_token = p_owner,
               attempt = t.attempt + 1, lease_until = now() + v_lease,
               hold_on_unknown = p_hold, updated_at = now(),
               expires_at = greatest(t.expires_at, now() + v_lease)
         WHERE t.tenant = p_tenant AND t.operation = p_operation
           AND t.idem_key = p_key AND t.owner_token = r.owner_token
           AND t.state = r.state AND t.expires_at > now()
        RETURNING t.attempt, t.expires_at INTO v_attempt, v_expires;
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
