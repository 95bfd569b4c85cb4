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
