-- The idempotency records and the claim function.
--
-- One row per (tenant, operation, key). tenant is the first column of every
-- key so that a distributed PostgreSQL can place all of a tenant's rows on
-- one shard. All times come from the database's clock (now()).

CREATE TABLE idempotency_records (
    tenant           text        NOT NULL,
    operation        text        NOT NULL,
    idem_key         text        NOT NULL,
    request_hash     bytea       NOT NULL,
    state            text        NOT NULL
                     CHECK (state IN ('processing', 'completed', 'released')),
    owner_token      uuid        NOT NULL,   -- the attempt that owns the key
    attempt          integer     NOT NULL DEFAULT 1,
    lease_until      timestamptz,            -- set while processing
    hold_on_unknown  boolean     NOT NULL DEFAULT false,
    response_status  integer,
    response_headers text,                   -- "Name: value\r\n" lines
    response_body    bytea,
    replayable       boolean,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    expires_at       timestamptz NOT NULL,
    PRIMARY KEY (tenant, operation, idem_key)
);

CREATE INDEX idempotency_records_expires_at
    ON idempotency_records (expires_at);
CREATE INDEX idempotency_records_lease_until
    ON idempotency_records (lease_until) WHERE state = 'processing';

-- idem_claim decides, in one round trip, what to do with an attempt:
--   forward   no live record (none, or expired): this attempt owns the key
--   takeover  released, or processing with a dead lease: this attempt owns it
--   replay    completed with the same fingerprint (read-only: no write)
--   in_flight processing, lease alive
--   held      processing, lease ended, outcome unknown and on_unknown = hold
--   mismatch  live record with another fingerprint (checked first)
-- It reads first, so a replay or a rejection writes nothing. Writes are
-- guarded by what was read (INSERT .. ON CONFLICT DO NOTHING, UPDATE .. WHERE
-- the row is still as read); when a concurrent attempt changed the row in
-- between, the loop reads it again with a fresh snapshot (READ COMMITTED,
-- VOLATILE: every statement sees the latest committed state).
CREATE FUNCTION idem_claim(p_tenant text, p_operation text, p_key text,
                           p_hash bytea, p_lease_ms bigint, p_ttl_ms bigint,
                           p_hold boolean)
RETURNS TABLE (o_decision text, o_owner uuid, o_attempt integer,
               o_lease_ms bigint, o_status integer, o_headers text,
               o_body bytea, o_replayable boolean, o_expires_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    r         idempotency_records%ROWTYPE;
    v_owner   uuid;
    v_attempt integer;
    v_expires timestamptz;
    v_lease   interval := p_lease_ms * interval '1 millisecond';
    v_ttl     interval := p_ttl_ms * interval '1 millisecond';
BEGIN
    FOR i IN 1..10 LOOP
        SELECT * INTO r FROM idempotency_records t
         WHERE t.tenant = p_tenant AND t.operation = p_operation
           AND t.idem_key = p_key;

        IF NOT FOUND THEN
            v_owner := gen_random_uuid();
            INSERT INTO idempotency_records AS t
                   (tenant, operation, idem_key, request_hash, state,
                    owner_token, attempt, lease_until, hold_on_unknown,
                    created_at, updated_at, expires_at)
            VALUES (p_tenant, p_operation, p_key, p_hash, 'processing',
                    v_owner, 1, now() + v_lease, p_hold,
                    now(), now(), now() + v_ttl)
            ON CONFLICT DO NOTHING;
            IF FOUND THEN
                RETURN QUERY SELECT 'forward'::text, v_owner, 1, p_lease_ms,
                    NULL::integer, NULL::text, NULL::bytea, NULL::boolean,
                    p_ttl_ms;
                RETURN;
            END IF;
            CONTINUE;   -- a concurrent attempt inserted first: read it
        END IF;

        IF r.expires_at <= now() THEN
            -- Expired but not yet purged: counts as absent.
            v_owner := gen_random_uuid();
            UPDATE idempotency_records t
               SET request_hash = p_hash, state = 'processing',
                   owner_token = v_owner, attempt = 1,
                   lease_until = now() + v_lease, hold_on_unknown = p_hold,
                   response_status = NULL, response_headers = NULL,
                   response_body = NULL, replayable = NULL,
                   created_at = now(), updated_at = now(),
                   expires_at = now() + v_ttl
             WHERE t.tenant = p_tenant AND t.operation = p_operation
               AND t.idem_key = p_key AND t.owner_token = r.owner_token
               AND t.expires_at <= now();
            IF FOUND THEN
                RETURN QUERY SELECT 'forward'::text, v_owner, 1, p_lease_ms,
                    NULL::integer, NULL::text, NULL::bytea, NULL::boolean,
                    p_ttl_ms;
                RETURN;
            END IF;
            CONTINUE;
        END IF;

        IF r.request_hash <> p_hash THEN
            RETURN QUERY SELECT 'mismatch'::text, NULL::uuid, r.attempt,
                0::bigint, NULL::integer, NULL::text, NULL::bytea, NULL::boolean,
                0::bigint;
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
                NULL::integer, NULL::text, NULL::bytea, NULL::boolean,
                0::bigint;
            RETURN;
        END IF;

        IF r.state = 'processing' AND r.hold_on_unknown THEN
            RETURN QUERY SELECT 'held'::text, NULL::uuid, r.attempt, 0::bigint,
                NULL::integer, NULL::text, NULL::bytea, NULL::boolean,
                0::bigint;
            RETURN;
        END IF;

        -- Released, or processing with a dead lease: take over.
        v_owner := gen_random_uuid();
        UPDATE idempotency_records t
           SET state = 'processing', owner_token = v_owner,
               attempt = t.attempt + 1, lease_until = now() + v_lease,
               hold_on_unknown = p_hold, updated_at = now()
         WHERE t.tenant = p_tenant AND t.operation = p_operation
           AND t.idem_key = p_key AND t.owner_token = r.owner_token
           AND t.state = r.state AND t.expires_at > now()
        RETURNING t.attempt, t.expires_at INTO v_attempt, v_expires;
        IF FOUND THEN
            RETURN QUERY SELECT 'takeover'::text, v_owner, v_attempt,
                p_lease_ms, NULL::integer, NULL::text, NULL::bytea,
                NULL::boolean,
                floor(extract(epoch FROM v_expires - now()) * 1000)::bigint;
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'idem_claim: key % kept changing under contention', p_key
        USING ERRCODE = '40001';
END
$$;
