-- Operator flags (the brake and other switches), by name. The first table:
-- every later migration adds the tables of one part of the backend.
CREATE TABLE flags (
    name       text PRIMARY KEY,
    value      text NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
