-- postbox 0.8.0 -> 0.9.0.
-- Apply with `psql -1 -f`, ALTER EXTENSION postbox UPDATE, or `postbox migrate`.

SELECT postbox._secure();

INSERT INTO postbox.schema_version (version) VALUES ('0.9.0');
