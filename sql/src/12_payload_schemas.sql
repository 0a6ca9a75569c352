-- Payload schemas (since 0.9.0): a queue or topic may say what its message
-- bodies must be, a JSON Schema (2020-12) document or a protobuf message type
-- from a FileDescriptorSet. The server compiles the schema when it is set and
-- checks every body it sends or publishes against it; the engine only keeps
-- the schema, in this shape:
--   {"json_schema": "<the document's text>"}
--   {"protobuf": {"file_descriptor_set": "<base64>", "message_type": "pkg.Type"}}
-- Sends and publishes made directly in SQL are not checked: PL/pgSQL has no
-- JSON Schema or protobuf validator. Each change signals on channel postbox
-- ("#payload_schema:queues:<name>" or "#payload_schema:topics:<name>"), on
-- which each server process drops what it cached of that schema.

-- The message of a check of a payload_schema setting, or NULL when it is well
-- formed or null (no schema). Limits: a JSON Schema of at most 65536 bytes, a
-- descriptor set of at most 262144 bytes, a message type of 1-512 characters.
CREATE FUNCTION postbox._payload_schema_problem(payload_schema jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN payload_schema IS NULL OR payload_schema = 'null' THEN NULL
        WHEN jsonb_typeof(payload_schema) <> 'object'
             OR (SELECT count(*) FROM jsonb_object_keys(payload_schema)) <> 1
             OR NOT (payload_schema ? 'json_schema' OR payload_schema ? 'protobuf') THEN
            'payload_schema must be an object of exactly one of json_schema (the document''s text) '
            'and protobuf ({"file_descriptor_set": base64, "message_type": a full name})'
        WHEN payload_schema ? 'json_schema' THEN
            CASE WHEN jsonb_typeof(payload_schema -> 'json_schema') <> 'string'
                      OR octet_length(payload_schema ->> 'json_schema') NOT BETWEEN 1 AND 65536 THEN
                'payload_schema.json_schema must be a string of 1 to 65536 bytes'
            END
        WHEN jsonb_typeof(payload_schema -> 'protobuf') <> 'object'
             OR EXISTS (SELECT FROM jsonb_object_keys(payload_schema -> 'protobuf') k
                        WHERE k NOT IN ('file_descriptor_set', 'message_type'))
             OR jsonb_typeof(payload_schema #> '{protobuf,file_descriptor_set}') IS DISTINCT FROM 'string'
             OR jsonb_typeof(payload_schema #> '{protobuf,message_type}') IS DISTINCT FROM 'string' THEN
            'payload_schema.protobuf must be an object of file_descriptor_set (base64) and message_type'
        WHEN NOT (payload_schema #>> '{protobuf,file_descriptor_set}') ~ '^[A-Za-z0-9+/]*={0,2}$'
             OR length(payload_schema #>> '{protobuf,file_descriptor_set}') % 4 <> 0
             OR length(payload_schema #>> '{protobuf,file_descriptor_set}') > 349528 THEN
            'payload_schema.protobuf.file_descriptor_set must be base64 of at most 262144 bytes'
        WHEN length(payload_schema #>> '{protobuf,message_type}') NOT BETWEEN 1 AND 512 THEN
            'payload_schema.protobuf.message_type must be a full message name of 1 to 512 characters'
    END
$$;

CREATE FUNCTION postbox._payload_schema_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('postbox', '#payload_schema:' || TG_TABLE_NAME || ':'
                                 || CASE WHEN TG_OP = 'DELETE' THEN OLD.name ELSE NEW.name END);
    RETURN NULL;
END
$$;

-- Creating a queue or topic notifies too: a server may have looked the name up
-- while it did not exist.
CREATE TRIGGER payload_schema_set AFTER INSERT OR DELETE ON postbox.queues
FOR EACH ROW EXECUTE FUNCTION postbox._payload_schema_changed();
CREATE TRIGGER payload_schema_changed AFTER UPDATE OF payload_schema ON postbox.queues
FOR EACH ROW WHEN (OLD.payload_schema IS DISTINCT FROM NEW.payload_schema)
EXECUTE FUNCTION postbox._payload_schema_changed();
CREATE TRIGGER payload_schema_set AFTER INSERT OR DELETE ON postbox.topics
FOR EACH ROW EXECUTE FUNCTION postbox._payload_schema_changed();
CREATE TRIGGER payload_schema_changed AFTER UPDATE OF payload_schema ON postbox.topics
FOR EACH ROW WHEN (OLD.payload_schema IS DISTINCT FROM NEW.payload_schema)
EXECUTE FUNCTION postbox._payload_schema_changed();
