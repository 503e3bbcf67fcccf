//! Helpers for backend configurations: option values and URL parts, parsed the same way and
//! refused with the same messages in every backend.

use std::time::Duration;

use crate::error::{LockError, Result};

/// A [`LockError::Config`] for `backend`.
pub fn config_error(backend: &'static str, reason: impl Into<String>) -> LockError {
    LockError::Config {
        backend,
        reason: reason.into(),
    }
}

/// The longest duration a configuration option takes (a year): longer is surely a unit mistake,
/// and it keeps sums of configured durations far from overflow.
pub const MAX_OPTION_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Parses a duration option such as `500ms`, `2s` or `1m` (humantime syntax); zero and durations
/// over [`MAX_OPTION_DURATION`] are refused.
///
/// # Errors
/// [`LockError::Config`] naming the option.
pub fn duration_option(backend: &'static str, key: &str, value: &str) -> Result<Duration> {
    let duration = humantime::parse_duration(value)
        .map_err(|e| config_error(backend, format!("option `{key}`: {e}")))?;
    if duration.is_zero() {
        return Err(config_error(
            backend,
            format!("option `{key}` must be greater than zero"),
        ));
    }
    if duration > MAX_OPTION_DURATION {
        return Err(config_error(
            backend,
            format!("option `{key}` is {value}; the limit is a year"),
        ));
    }
    Ok(duration)
}

/// Parses a boolean option: `true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off`, in any case.
///
/// # Errors
/// [`LockError::Config`] naming the option.
pub fn bool_option(backend: &'static str, key: &str, value: &str) -> Result<bool> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(config_error(
            backend,
            format!("option `{key}` takes true or false, not `{value}`"),
        )),
    }
}

/// Decodes `%XX` escapes in a URL part (user name, password, path); `+` stays `+`.
pub fn percent_decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_options() {
        assert_eq!(
            duration_option("x", "t", "250ms").unwrap(),
            Duration::from_millis(250)
        );
        assert!(duration_option("x", "t", "0s").is_err());
        assert!(duration_option("x", "t", "soon").is_err());
        assert!(duration_option("x", "t", "999999999999s").is_err());
        assert!(duration_option("x", "t", "18446744073709551615ms").is_err());
        assert!(bool_option("x", "b", "ON").unwrap());
        assert!(!bool_option("x", "b", "0").unwrap());
        assert!(bool_option("x", "b", "maybe").is_err());
        assert_eq!(percent_decode("p%40ss+word"), "p@ss+word");
    }
}
