//! The `postgres` backend for dlock. Not written yet: its issue fills this crate.
//! Until then `dlock::connect` answers a `postgres` URL with a `Config` error saying so.
