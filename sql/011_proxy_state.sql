-- State the instances share beside the records.
--
-- idemproxy_secrets: secrets the instances read at start. 'wait_notify'
-- keys the hash a NOTIFY payload carries (HMAC-SHA256 over tenant,
-- operation and key): any role that can connect may LISTEN on the channel,
-- and without the key it cannot test a guessed tenant, route and key
-- against what is in flight. 32 random bytes from gen_random_uuid (the
-- server's strong random source; 244 random bits). Only the table's owner
-- (the role that migrates, which the proxy uses) reads it; grant SELECT to
-- a separate proxy role if there is one. Changing the row while instances
-- run makes their payloads disagree until every instance restarted.
CREATE TABLE idemproxy_secrets (
    name text PRIMARY KEY,
    secret bytea NOT NULL CHECK (length(secret) BETWEEN 32 AND 64)
);
REVOKE ALL ON idemproxy_secrets FROM PUBLIC;
INSERT INTO idemproxy_secrets (name, secret)
VALUES ('wait_notify',
        decode(replace(gen_random_uuid()::text || gen_random_uuid()::text,
                       '-', ''), 'hex'));

-- idemproxy_seal_counts: seals made under each store_encryption key id,
-- by every instance and --reencrypt, since the key was first used. Each
-- seal draws a random 96-bit GCM nonce, safe for about 2^32 seals per key
-- (NIST SP 800-38D); the instances warn at store_encryption.warn_seals.
-- Counted here rather than derived from the records: re-sealing, purging
-- and failed writes would make a count of rows understate the nonces
-- drawn. Each instance adds what it sealed at every reaper pass (a crash
-- loses at most one pass's worth, far inside the margin). A key's row may
-- be deleted once the key is retired and removed from every key file.
CREATE TABLE idemproxy_seal_counts (
    seal_key text PRIMARY KEY,
    seals bigint NOT NULL CHECK (seals >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
