-- The psql script of the PostgreSQL system test. Its output must be the same
-- byte for byte over plain TCP and under rdmashim (either or both ends), so
-- nothing here depends on time, OIDs or randomness on the server. postgres.sh
-- replaces the line "-- @BLOBS@" with a few megabytes of generated rows for
-- COPY ... FROM STDIN (the same rows for every run of one test).
\set ON_ERROR_STOP 1
\pset pager off

-- tables, inserts, updates
CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL, balance numeric(14,2) NOT NULL);
INSERT INTO accounts SELECT g, 'owner-' || g || ' zażółć gęślą jaźń', g * 10.25 FROM generate_series(1, 5000) g;
UPDATE accounts SET balance = balance + 1 WHERE id % 3 = 0;
DELETE FROM accounts WHERE id % 97 = 0;
SELECT count(*), sum(balance), min(balance), max(balance) FROM accounts;

-- a committed transfer
BEGIN;
UPDATE accounts SET balance = balance - 100 WHERE id = 1;
UPDATE accounts SET balance = balance + 100 WHERE id = 2;
SELECT id, balance FROM accounts WHERE id IN (1, 2) ORDER BY id;
COMMIT;

-- a transaction rolled back
BEGIN;
DELETE FROM accounts WHERE id > 10;
INSERT INTO accounts VALUES (100000, 'ghost', 1);
SELECT count(*) FROM accounts;
ROLLBACK;
SELECT count(*), sum(balance) FROM accounts;

-- a savepoint rolled back inside a committed transaction
BEGIN;
UPDATE accounts SET balance = 0 WHERE id <= 100;
SAVEPOINT s1;
UPDATE accounts SET balance = -1;
ROLLBACK TO SAVEPOINT s1;
COMMIT;
SELECT count(*) FILTER (WHERE balance = 0), count(*) FILTER (WHERE balance < 0) FROM accounts;

-- an error inside a transaction (the server reports it, the client rolls back)
\set ON_ERROR_STOP 0
BEGIN;
INSERT INTO accounts VALUES (1, 'duplicate', 0);
ROLLBACK;
\set ON_ERROR_STOP 1

-- ordered reads
SELECT * FROM accounts ORDER BY id LIMIT 20;
SELECT * FROM accounts ORDER BY balance DESC, id LIMIT 20 OFFSET 100;
SELECT id % 10 AS bucket, count(*), sum(balance), avg(balance)::numeric(14,4) FROM accounts GROUP BY 1 ORDER BY 1;
PREPARE by_id(int) AS SELECT owner, balance FROM accounts WHERE id = $1;
EXECUTE by_id(42);
EXECUTE by_id(4242);
SELECT md5(string_agg(id || ':' || owner || ':' || balance, ',' ORDER BY id)) FROM accounts;

-- a few megabytes in with COPY FROM STDIN
CREATE TABLE blobs (id int PRIMARY KEY, hex text NOT NULL, b64 text NOT NULL);
COPY blobs FROM STDIN;
-- @BLOBS@
\.
SELECT count(*), sum(length(hex)), sum(length(b64)) FROM blobs;
SELECT md5(string_agg(hex || b64, '' ORDER BY id)) FROM blobs;
SELECT id, length(hex), left(hex, 24), right(b64, 24) FROM blobs ORDER BY id DESC LIMIT 5;

-- and out: the whole table (several MB through the client's ring) and a digest per row
COPY (SELECT * FROM blobs ORDER BY id) TO STDOUT;
COPY (SELECT id, md5(hex), md5(b64) FROM blobs ORDER BY id) TO STDOUT WITH (FORMAT csv, HEADER);

-- bytea and one large value (4 MB in one DataRow)
CREATE TABLE bin AS SELECT id, decode(hex, 'hex') AS bytes FROM blobs;
SELECT sum(length(bytes)), md5(string_agg(bytes, '\x00'::bytea ORDER BY id)) FROM bin;
SELECT length(v), md5(v) FROM (SELECT string_agg(hex, '' ORDER BY id) AS v FROM blobs) s;
SELECT left(string_agg(hex, '' ORDER BY id), 64) || '...' || right(string_agg(hex, '' ORDER BY id), 64) FROM blobs;
\pset format unaligned
\pset tuples_only on
SELECT string_agg(hex, '' ORDER BY id) FROM blobs;
\pset tuples_only off
\pset format aligned

-- updates of many rows, then reads again
UPDATE blobs SET hex = upper(hex) WHERE id % 2 = 0;
SELECT md5(string_agg(hex, '' ORDER BY id)) FROM blobs;
DROP TABLE bin;
SELECT count(*) FROM blobs;
