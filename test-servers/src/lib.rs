//! Test servers (filled by issue 3).
