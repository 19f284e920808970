"""Connected database tables: generic, permissioned table tools over SQLite and PostgreSQL."""
