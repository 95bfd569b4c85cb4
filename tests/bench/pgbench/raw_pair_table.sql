-- The raw two-commit pair's own table (raw_pair.sql), created by the bench
-- in its throwaway database: a key, the attempt that owns it and the
-- response, with only the primary key as an index. What any store that
-- claims a key and then records the answer in two autocommit statements
-- must at least pay, whatever idemproxy's own schema is.
CREATE TABLE bench_raw_pair (
    k      text    PRIMARY KEY,
    owner  bigint  NOT NULL,
    status integer,
    body   bytea
);
