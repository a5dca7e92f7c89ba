//! Process exit codes (sysexits.h).

/// Success.
pub const OK: i32 = 0;
/// Generic failure (e.g. a bench run that saw errors).
pub const FAILURE: i32 = 1;
/// Command-line usage error.
pub const USAGE: i32 = 64;
/// A service needed is unavailable (a port is taken, a target unreachable).
pub const UNAVAILABLE: i32 = 69;
/// Permission denied (a missing or wrong admin token).
pub const NOPERM: i32 = 77;
/// Configuration error.
pub const CONFIG: i32 = 78;
