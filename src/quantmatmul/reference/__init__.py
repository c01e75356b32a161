"""reference: plain numpy oracles written from the specs; used by the tests, never by the fast path."""
