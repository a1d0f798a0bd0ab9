"""Fault-injection (chaos) suite: members, coordinators, Postgres and links broken at seeded
random times while keyed records flow, and the ledger checked for Keyrange's promises."""
