//! When to try again: exponential backoff, or what the provider's `Retry-After` asks for.
//!
//! A retry happens only before the first byte of a reply is forwarded to loopd (a second
//! attempt would repeat text loopd has already shown) and only while the request's deadline
//! leaves room for the wait: a wait past the deadline fails now instead of failing later.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The longest single backoff wait.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The wait before retry `n` (1 for the first retry): `base`, `2 × base`, `4 × base`, ...,
/// at most [`MAX_BACKOFF`].
pub fn backoff(base: Duration, n: u32) -> Duration {
    let factor = 1u32 << n.saturating_sub(1).min(16);
    base.saturating_mul(factor).min(MAX_BACKOFF)
}

/// The wait a response asks for: `retry-after-ms` (milliseconds, as OpenAI sends it), else
/// `Retry-After` as seconds or as an HTTP date. `None` when neither is there or parses.
pub fn retry_after(
    retry_after_ms: Option<&str>,
    retry_after: Option<&str>,
    now: SystemTime,
) -> Option<Duration> {
    if let Some(ms) = retry_after_ms.and_then(|v| v.trim().parse::<f64>().ok()) {
        if ms.is_finite() && ms >= 0.0 {
            return Some(Duration::from_millis(ms.min(86_400_000.0) as u64));
        }
    }
    let v = retry_after?.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs.min(86_400)));
    }
    let at = http_date(v)?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the form RFC 9110 requires senders to use.
fn http_date(v: &str) -> Option<SystemTime> {
    let rest = v.split_once(", ")?.1;
    let parts: Vec<&str> = rest.split(' ').collect();
    let [day, month, year, time, "GMT"] = parts.as_slice() else {
        return None;
    };
    let day: u64 = day.parse().ok()?;
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| m == month)? as u64
        + 1;
    let year: u64 = year.parse().ok()?;
    let hms: Vec<u64> = time
        .split(':')
        .map(|p| p.parse().ok())
        .collect::<Option<Vec<u64>>>()?;
    let [h, m, s] = hms.as_slice() else {
        return None;
    };
    if !(1..=31).contains(&day) || year < 1970 || *h > 23 || *m > 59 || *s > 60 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    Some(UNIX_EPOCH + Duration::from_secs(days * 86_400 + h * 3600 + m * 60 + s))
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar (year ≥ 1970).
fn days_from_civil(y: u64, m: u64, d: u64) -> u64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let b = Duration::from_millis(500);
        assert_eq!(backoff(b, 1), Duration::from_millis(500));
        assert_eq!(backoff(b, 2), Duration::from_millis(1000));
        assert_eq!(backoff(b, 3), Duration::from_millis(2000));
        assert_eq!(backoff(b, 40), MAX_BACKOFF);
    }

    #[test]
    fn retry_after_takes_milliseconds_seconds_and_dates() {
        let now = UNIX_EPOCH + Duration::from_secs(784_111_777);
        assert_eq!(
            retry_after(Some("1500"), Some("9"), now),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            retry_after(None, Some("2"), now),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            retry_after(None, Some("Sun, 06 Nov 1994 08:49:40 GMT"), now),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            retry_after(None, Some("Sun, 06 Nov 1994 08:49:00 GMT"), now),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after(None, Some("soon"), now), None);
        assert_eq!(retry_after(Some("x"), None, now), None);
        assert_eq!(retry_after(None, None, now), None);
    }

    #[test]
    fn civil_days_match_known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(2026, 11, 30), 20_787);
    }
}
