-- postbox 0.6.0 -> 0.7.0.
-- Apply with `psql -1 -f`, ALTER EXTENSION postbox UPDATE, or `postbox migrate`.

INSERT INTO postbox.schema_version (version) VALUES ('0.7.0');
