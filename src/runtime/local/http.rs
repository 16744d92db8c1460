//! The HTTP answers of kube-proxy's health servers, byte for byte as its Go code writes them
//! (`pkg/proxy/healthcheck`): a Service's health check (`service_health.go`) and the proxy's
//! own `/healthz` and `/livez` (`proxy_health.go`), with the headers Go's `net/http` adds
//! (`Date`, `Content-Length`). tapyard closes each connection after its answer and says so
//! (`Connection: close`).

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A health check's state: the Service's name as kube-proxy's `types.NamespacedName` and
/// its endpoints on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceHealth {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
    /// Its endpoints on this node (`localEndpoints`).
    pub local_endpoints: usize,
}

impl ServiceHealth {
    /// The health state of the tapyard Service called `service` (`namespace/name:port` in
    /// Kubernetes terms; the namespace `default` and no port part are assumed where the name
    /// has none) with `local_endpoints` endpoints on this node.
    pub fn of(service: &str, local_endpoints: usize) -> ServiceHealth {
        let (namespace, rest) = service.split_once('/').unwrap_or(("default", service));
        let name = rest.rsplit_once(':').map_or(rest, |(n, _)| n);
        ServiceHealth {
            namespace: namespace.to_string(),
            name: name.to_string(),
            local_endpoints,
        }
    }
}

/// The answer to a request for a Service's health check (any path, any method, as Go's
/// handler): `200 OK` with local endpoints, `503 Service Unavailable` without (the proxy is
/// always healthy: tapyard applies every change before it answers, so none is ever pending).
pub fn service_answer(h: &ServiceHealth, date: SystemTime) -> Vec<u8> {
    // service_health.go: the dedented, trimmed template (tabs kept).
    let body = format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {},\n\t\t\"name\": {}\n\t}},\n\t\"localEndpoints\": {},\n\t\"serviceProxyHealthy\": true\n}}",
        go_quote(&h.namespace),
        go_quote(&h.name),
        h.local_endpoints
    );
    let status = if h.local_endpoints != 0 {
        "200 OK"
    } else {
        "503 Service Unavailable"
    };
    let weight = h.local_endpoints.to_string();
    response(
        status,
        &[
            ("Content-Type", "application/json"),
            ("X-Content-Type-Options", "nosniff"),
            ("X-Load-Balancing-Endpoint-Weight", &weight),
        ],
        &body,
        date,
    )
}

/// The answer of the proxy's health server (`[node] healthz_port`) to a request for `path`:
/// `/healthz` (with `nodeEligible`) and `/livez` answer `200 OK` (healthy, the node
/// eligible: tapyard has no pending update and no node object to be deleted), anything else
/// `404 page not found` as Go's `ServeMux`. `since_start` is the process's uptime, which Go
/// prints as the time's monotonic reading (`m=+…`).
pub fn proxy_answer(path: &str, date: SystemTime, since_start: Duration) -> Vec<u8> {
    let now = go_time(date, since_start);
    let body = match path {
        "/healthz" => {
            format!("{{\"lastUpdated\": {now},\"currentTime\": {now}, \"nodeEligible\": true}}")
        }
        "/livez" => format!("{{\"lastUpdated\": {now},\"currentTime\": {now}}}"),
        _ => {
            return response(
                "404 Not Found",
                &[
                    ("Content-Type", "text/plain; charset=utf-8"),
                    ("X-Content-Type-Options", "nosniff"),
                ],
                "404 page not found\n",
                date,
            )
        }
    };
    response(
        "200 OK",
        &[
            ("Content-Type", "application/json"),
            ("X-Content-Type-Options", "nosniff"),
        ],
        &body,
        date,
    )
}

/// The answer to a request that is no HTTP/1 request, or whose head is too long: `400 Bad
/// Request`, as Go's server.
pub fn bad_request(date: SystemTime) -> Vec<u8> {
    response(
        "400 Bad Request",
        &[("Content-Type", "text/plain; charset=utf-8")],
        "400 Bad Request",
        date,
    )
}

/// The path of a request's head (`GET /healthz HTTP/1.1` …), without its query; `None` for
/// anything that is not an HTTP/1 request line.
pub fn request_path(head: &[u8]) -> Option<&str> {
    let line_end = head.iter().position(|&c| c == b'\r' || c == b'\n')?;
    let line = std::str::from_utf8(head.get(..line_end)?).ok()?;
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if method.is_empty() || parts.next().is_some() || !version.starts_with("HTTP/1.") {
        return None;
    }
    Some(target.split('?').next().unwrap_or(target))
}

/// A whole HTTP/1.1 response: status line, `headers`, `Date`, `Content-Length`,
/// `Connection: close`, body.
fn response(status: &str, headers: &[(&str, &str)], body: &str, date: SystemTime) -> Vec<u8> {
    let mut s = format!("HTTP/1.1 {status}\r\n");
    for (k, v) in headers {
        let _ = write!(s, "{k}: {v}\r\n");
    }
    let _ = write!(
        s,
        "Date: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        http_date(date),
        body.len()
    );
    s.into_bytes()
}

/// `s` as Go's `%q` quotes it (the characters a Kubernetes name has need no escape but `"`
/// and `\`).
fn go_quote(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                q.push('\\');
                q.push(c);
            }
            c if c.is_control() => {
                let _ = write!(q, "\\x{:02x}", u32::from(c));
            }
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

/// Days since 1970-01-01 as (year, month, day) (Howard Hinnant's `civil_from_days`).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        y,
        u32::try_from(m).unwrap_or(1),
        u32::try_from(d).unwrap_or(1),
    )
}

/// `t` split into UTC (days since the epoch, seconds of the day, nanoseconds).
fn split(t: SystemTime) -> (i64, u64, u32) {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    (
        i64::try_from(secs / 86_400).unwrap_or(0),
        secs % 86_400,
        d.subsec_nanos(),
    )
}

/// `t` as an HTTP date (`Sun, 06 Dec 2026 22:15:00 GMT`, RFC 9110's IMF-fixdate).
fn http_date(t: SystemTime) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (days, sod, _) = split(t);
    let (y, m, d) = civil(days);
    let wd = DAYS
        .get(usize::try_from(days.rem_euclid(7)).unwrap_or(0))
        .unwrap_or(&"Thu");
    let mon = MONTHS
        .get(usize::try_from(m.saturating_sub(1)).unwrap_or(0))
        .unwrap_or(&"Jan");
    format!(
        "{wd}, {d:02} {mon} {y} {:02}:{:02}:{:02} GMT",
        sod / 3600,
        sod / 60 % 60,
        sod % 60
    )
}

/// `t` as Go's `%q` prints a `time.Time` from `time.Now()` in UTC:
/// `"2026-12-06 22:15:00.123456789 +0000 UTC m=+12.000000001"` (fraction without its
/// trailing zeros, the monotonic reading `since_start` with nine digits).
fn go_time(t: SystemTime, since_start: Duration) -> String {
    let (days, sod, nanos) = split(t);
    let (y, m, d) = civil(days);
    let mut frac = String::new();
    if nanos != 0 {
        frac = format!(".{nanos:09}");
        while frac.ends_with('0') {
            frac.pop();
        }
    }
    format!(
        "\"{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}{frac} +0000 UTC m=+{}.{:09}\"",
        sod / 3600,
        sod / 60 % 60,
        sod % 60,
        since_start.as_secs(),
        since_start.subsec_nanos()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-12-06 22:15:00.5 UTC, a Sunday.
    fn when() -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(1_796_595_300_500)
    }

    fn split_answer(a: &[u8]) -> (String, String) {
        let s = String::from_utf8(a.to_vec()).unwrap();
        let (head, body) = s.split_once("\r\n\r\n").unwrap();
        (head.to_string(), body.to_string())
    }

    #[test]
    fn a_service_with_local_endpoints_is_healthy_as_kube_proxy_says_it() {
        let h = ServiceHealth::of("shop/web:http", 2);
        assert_eq!((h.namespace.as_str(), h.name.as_str()), ("shop", "web"));
        let (head, body) = split_answer(&service_answer(&h, when()));
        assert_eq!(
            head,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Content-Type-Options: nosniff\r\n\
             X-Load-Balancing-Endpoint-Weight: 2\r\nDate: Sun, 06 Dec 2026 22:15:00 GMT\r\n\
             Content-Length: 111\r\nConnection: close"
        );
        assert_eq!(
            body,
            "{\n\t\"service\": {\n\t\t\"namespace\": \"shop\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
        );
        assert_eq!(body.len(), 111);
    }

    #[test]
    fn a_service_without_local_endpoints_is_unavailable_with_weight_zero() {
        let h = ServiceHealth::of("web", 0);
        assert_eq!((h.namespace.as_str(), h.name.as_str()), ("default", "web"));
        let (head, body) = split_answer(&service_answer(&h, when()));
        assert!(
            head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{head}"
        );
        assert!(head.contains("\r\nX-Load-Balancing-Endpoint-Weight: 0\r\n"));
        assert!(head.contains(&format!("\r\nContent-Length: {}\r\n", body.len())));
        assert!(body.contains("\"localEndpoints\": 0,"), "{body}");
    }

    #[test]
    fn healthz_and_livez_have_proxy_health_go_bodies_and_other_paths_404() {
        let up = Duration::new(12, 1);
        let (head, body) = split_answer(&proxy_answer("/healthz", when(), up));
        assert!(head.starts_with("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Content-Type-Options: nosniff\r\n"));
        let t = "\"2026-12-06 22:15:00.5 +0000 UTC m=+12.000000001\"";
        assert_eq!(
            body,
            format!("{{\"lastUpdated\": {t},\"currentTime\": {t}, \"nodeEligible\": true}}")
        );
        let (_, body) = split_answer(&proxy_answer("/livez", when(), up));
        assert_eq!(
            body,
            format!("{{\"lastUpdated\": {t},\"currentTime\": {t}}}")
        );
        let (head, body) = split_answer(&proxy_answer("/", when(), up));
        assert!(head.starts_with("HTTP/1.1 404 Not Found\r\n"));
        assert_eq!(body, "404 page not found\n");
    }

    #[test]
    fn request_lines_are_parsed_and_garbage_refused() {
        assert_eq!(
            request_path(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some("/healthz")
        );
        assert_eq!(
            request_path(b"GET /livez?x=1 HTTP/1.0\r\n\r\n"),
            Some("/livez")
        );
        assert_eq!(request_path(b"\x16\x03\x01 hello\r\n"), None);
        assert_eq!(request_path(b"GET / SSH-2.0\r\n"), None);
        assert_eq!(request_path(b"no end"), None);
        assert!(bad_request(when()).starts_with(b"HTTP/1.1 400 Bad Request\r\n"));
    }

    #[test]
    fn dates_are_right_across_eras() {
        assert_eq!(http_date(UNIX_EPOCH), "Thu, 01 Jan 1970 00:00:00 GMT");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(http_date(leap), "Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(go_quote("a\"b\\"), "\"a\\\"b\\\\\"");
    }
}
