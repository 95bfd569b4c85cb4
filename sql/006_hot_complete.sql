-- First attempts at the store's limit: complete becomes a HOT update, a
-- fresh key costs one insert, and the reaper finds dead leases without an
-- index that complete would have to update.
--
-- Complete changes state, the response columns and updated_at. The partial
-- index on (lease_until) WHERE state = 'processing' depended on state and
-- lease_until, so every complete wrote a new row version elsewhere and an
-- entry in all three indexes. Now no index covers a column complete
-- changes, and the table leaves 30 % of each new page free, so the
-- completed version of a row fits on the page of its first version (a HOT
-- update: no index entry, less WAL, fewer pages dirtied after a
-- checkpoint).
--
-- lease_until now keeps the end of the last lease after complete (it is no
-- longer set to NULL there); it is NULL only for a released row. The new
-- plain index on it serves the reaper: it walks the leases that ended since
-- its last walk (a range of that index, not every processing row), and the
-- processing gauges read the live leases (the reaper keeps the held rows it
-- passed). Completed rows written before this migration get their
-- updated_at as the end of their last lease.
DROP INDEX idempotency_records_lease_until;
UPDATE idempotency_records SET lease_until = updated_at
 WHERE state = 'completed' AND lease_until IS NULL;
CREATE INDEX idempotency_records_lease_end
    ON idempotency_records (lease_until);
-- New pages only: rows already stored stay where they are.
ALTER TABLE idempotency_records SET (fillfactor = 70);

-- idem_claim, as in 002, but a claim first tries the insert of a fresh key
-- (ON CONFLICT DO NOTHING: an existing row is left alone and the claim goes
-- on as before, reading it): a first attempt runs one statement instead of
-- a read, then the insert, and returns without a query.
CREATE OR REPLACE FUNCTION idem_claim(p_tenant text, p_operation text, p_key text,
                           p_hash bytea, p_lease_ms bigint, p_ttl_ms bigint,
                           p_hold boolean, p_owner uuid)
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
            created_at, updated_at, expires_at)
    VALUES (p_tenant, p_operation, p_key, p_hash, 'processing',
            p_owner, 1, now() + v_lease, p_hold,
            now(), now(), now() + v_ttl)
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
                    created_at, updated_at, expires_at)
            VALUES (p_tenant, p_operation, p_key, p_hash, 'processing',
                    p_owner, 1, now() + v_lease, p_hold,
                    now(), now(), now() + v_ttl)
            ON CONFLICT DO NOTHING;
            IF FOUND THEN
                RETURN QUERY SELECT 'forward'::text, p_owner, 1, p_lease_ms,
                    NULL::integer, NULL::bytea, NULL::bytea, NULL::boolean,
                    floor(extract(epoch FROM v_ttl) * 1000)::bigint;
                RETURN;
            END IF;
            CONTINUE;   -- a concurrent attempt inserted first: read it
        END IF;

        IF r.state = 'processing' AND r.owner_token = p_owner THEN
            -- This very attempt claimed the key already (a repeated claim).
            RETURN QUERY SELECT
                CASE WHEN r.attempt = 1 THEN 'forward' ELSE 'takeover' END,
                p_owner, r.attempt,
                greatest(ceil(extract(epoch FROM r.lease_until - now())
                              * 1000), 0)::bigint,
                NULL::integer, NULL::bytea, NULL::bytea, NULL::boolean,
                floor(extract(epoch FROM r.expires_at - now()) * 1000)::bigint;
            RETURN;
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
                   expires_at = now() + v_ttl
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
