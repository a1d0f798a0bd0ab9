"""End-to-end tests: cooperative members against the real coordinator, Postgres and broker."""
