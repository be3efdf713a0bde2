//! Redis URLs as errors and logs show them: without passwords.

use std::fmt;

use crate::error::Error;

/// `url` with its password replaced by `***`: in the user info
/// (`redis://user:***@host/`) and in a `pass` or `password` query parameter
/// (`redis+unix:///run/redis.sock?pass=***`). Errors and logs show URLs only
/// through it.
pub(crate) fn redact(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let mut out = String::with_capacity(url.len());
    if let Some(scheme) = scheme {
        out.push_str(scheme);
        out.push_str("://");
    }
    // The last `@`, not the first: a password with an unescaped `@` must
    // not leave its tail in the host part.
    let rest = match rest.rfind('@') {
        Some(at) => {
            let user = &rest[..at];
            match user.split_once(':') {
                Some((name, _password)) => {
                    out.push_str(name);
                    out.push_str(":***");
                }
                None => out.push_str(user),
            }
            out.push('@');
            &rest[at + 1..]
        }
        None => rest,
    };
    match rest.split_once('?') {
        Some((path, query)) => {
            out.push_str(path);
            out.push('?');
            for (i, pair) in query.split('&').enumerate() {
                if i > 0 {
                    out.push('&');
                }
                match pair.split_once('=') {
                    Some((key @ ("pass" | "password"), _)) => {
                        out.push_str(key);
                        out.push_str("=***");
                    }
                    _ => out.push_str(pair),
                }
            }
        }
        None => out.push_str(rest),
    }
    out
}

/// A URL that does not parse, as an invalid `setting`, shown without its
/// password.
pub(crate) fn not_a_url(setting: &'static str, url: &str, e: impl fmt::Display) -> Error {
    Error::invalid(
        setting,
        format!(
            "`{}` is not a Redis URL ({e}); use redis://[user:password@]host[:port][/db], \
             or rediss:// for TLS",
            redact(url)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_passwords_and_keeps_the_rest() {
        let cases = [
            (
                "redis://:s3cret@127.0.0.1:6390/",
                "redis://:***@127.0.0.1:6390/",
            ),
            (
                "rediss://app:s3cret@db.internal/2",
                "rediss://app:***@db.internal/2",
            ),
            // An unescaped `@` in the password.
            ("redis://app:s3@cret@db/", "redis://app:***@db/"),
            ("redis://app@db/", "redis://app@db/"),
            ("redis://127.0.0.1:6379/", "redis://127.0.0.1:6379/"),
            (
                "redis+unix:///run/redis.sock?user=app&pass=s3cret&db=1",
                "redis+unix:///run/redis.sock?user=app&pass=***&db=1",
            ),
            (
                "redis://db/?password=s3cret&protocol=resp3",
                "redis://db/?password=***&protocol=resp3",
            ),
            ("app:s3cret@db:6379", "app:***@db:6379"),
        ];
        for (url, redacted) in cases {
            assert_eq!(redact(url), redacted, "{url}");
            assert!(!redact(url).contains("s3"), "{url}");
        }
    }
}
