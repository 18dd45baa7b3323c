-- Write bounds of an API key's propose purpose: the memory kinds and scopes it may write
-- ('*': any). NULL: unbounded, as every key was before bounds existed.
ALTER TABLE api_keys ADD COLUMN write_kinds text[];
ALTER TABLE api_keys ADD COLUMN write_scopes text[];
