//! URL normalisation: the request half of a lock key.
//!
//! The rule: lower-case scheme and host, default port dropped,
//! fragment dropped, unreserved `%XX` decoded (and other escapes upper-cased),
//! `%2F` kept, query sorted by name keeping repeated names in order, `?` kept
//! distinct from no query. Userinfo never survives, and signed-URL parameters
//! (the signature and the parameters that change with every signing) are
//! dropped, so a secret never reaches the lock and a re-signed URL still hits.

use std::fmt;
use std::net::IpAddr;

use crate::Error;

/// `http` or `https`: the only schemes the proxy knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scheme {
    Http,
    Https,
}

impl Scheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }

    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }

    pub fn parse(s: &str) -> Option<Scheme> {
        if s.eq_ignore_ascii_case("http") {
            Some(Scheme::Http)
        } else if s.eq_ignore_ascii_case("https") {
            Some(Scheme::Https)
        } else {
            None
        }
    }
}

/// A normalised request URL. Its `Display` is the form stored in the lock.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NormUrl {
    pub scheme: Scheme,
    /// Lower-case host; IPv6 literals without brackets.
    pub host: String,
    pub port: u16,
    /// Normalised path, always starting with `/`.
    pub path: String,
    /// Normalised query without the `?`; `Some("")` for a bare `?`.
    pub query: Option<String>,
}

impl NormUrl {
    /// Normalise from parts: `authority` is `[userinfo@]host[:port]`,
    /// `path_and_query` the request target's path and query (a fragment, if
    /// any, is dropped).
    pub fn from_parts(
        scheme: Scheme,
        authority: &str,
        path_and_query: &str,
    ) -> Result<Self, Error> {
        let (host, port) = split_authority(authority, scheme)?;
        let pq = path_and_query.split('#').next().unwrap_or("");
        let (path, query) = match pq.find('?') {
            Some(i) => (&pq[..i], Some(&pq[i + 1..])),
            None => (pq, None),
        };
        let path = if path.is_empty() {
            "/".to_string()
        } else if !path.starts_with('/') {
            return Err(Error::BadUrl(format!(
                "path {path:?} does not start with '/'"
            )));
        } else {
            norm_pct(path)
        };
        Ok(NormUrl {
            scheme,
            host,
            port,
            path,
            // A query made only of dropped secrets becomes no query at all.
            query: query.and_then(|q| {
                let n = norm_query(q);
                (q.is_empty() || !n.is_empty()).then_some(n)
            }),
        })
    }

    /// Parse and normalise an absolute `http(s)://` URL.
    pub fn parse(url: &str) -> Result<Self, Error> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| Error::BadUrl(format!("{url:?} is not an absolute URL")))?;
        let scheme = Scheme::parse(scheme)
            .ok_or_else(|| Error::BadUrl(format!("{url:?}: only http and https are supported")))?;
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, pq) = rest.split_at(end);
        let pq = if pq.starts_with('?') || pq.starts_with('#') {
            format!("/{pq}")
        } else {
            pq.to_string()
        };
        NormUrl::from_parts(scheme, authority, &pq)
    }

    /// `host[:port]` with the port omitted when it is the default, IPv6
    /// literals bracketed: what goes in a `Host` header.
    pub fn authority(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if self.port == self.scheme.default_port() {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }
}

impl fmt::Display for NormUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}://{}{}",
            self.scheme.as_str(),
            self.authority(),
            self.path
        )?;
        if let Some(q) = &self.query {
            write!(f, "?{q}")?;
        }
        Ok(())
    }
}

/// Split `[userinfo@]host[:port]` into a lower-case host and a port.
pub fn split_authority(authority: &str, scheme: Scheme) -> Result<(String, u16), Error> {
    let hostport = match authority.rfind('@') {
        Some(i) => &authority[i + 1..],
        None => authority,
    };
    let bad = || Error::BadUrl(format!("bad authority {authority:?}"));
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let close = rest.find(']').ok_or_else(bad)?;
        let host = &rest[..close];
        let after = &rest[close + 1..];
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return Err(bad()),
        };
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(bad());
        }
        (host, port)
    } else {
        match hostport.rsplit_once(':') {
            // A colon in a host is only an IPv6 literal, and those are
            // bracketed: `user:pw:443` (no `@`) is not a host.
            Some((h, _)) if h.contains(':') => return Err(bad()),
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    if host.is_empty()
        || !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:~%".contains(&b))
    {
        return Err(bad());
    }
    let port = match port {
        None | Some("") => scheme.default_port(),
        Some(p) => p.parse::<u16>().map_err(|_| bad())?,
    };
    let mut host = host.to_ascii_lowercase();
    if let Ok(ip) = host.parse::<IpAddr>() {
        host = ip.to_string();
    }
    Ok((host, port))
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hexval(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Decode `%XX` escapes of unreserved characters, upper-case the hex of
/// every other escape; leave everything else alone.
pub fn norm_pct(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hexval(b[i + 1]), hexval(b[i + 2])) {
                let v = h * 16 + l;
                // A decoded hex digit right after a stray `%` (or `%X`)
                // would make a new escape, and a second pass would decode
                // that: keep it encoded so normalising is idempotent.
                let ob = out.as_bytes();
                let n = ob.len();
                let would_escape = v.is_ascii_hexdigit()
                    && (ob.last() == Some(&b'%')
                        || (n >= 2 && ob[n - 2] == b'%' && ob[n - 1].is_ascii_hexdigit()));
                if is_unreserved(v) && !would_escape {
                    out.push(v as char);
                } else {
                    out.push('%');
                    out.push_str(&format!("{v:02X}"));
                }
                i += 3;
                continue;
            }
        }
        // Non-ASCII bytes cannot occur in a parsed request target; keep any
        // byte verbatim by going through the char boundary of the string.
        let ch_len = utf8_len(b[i]);
        out.push_str(&s[i..(i + ch_len).min(s.len())]);
        i += ch_len;
    }
    out
}

fn utf8_len(first: u8) -> usize {
    match first {
        0x00..=0x7f => 1,
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        _ => 4,
    }
}

/// Percent-decode for comparing parameter names (lossy, ASCII-case-folded).
fn decode_name(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hexval(b[i + 1]), hexval(b[i + 2])) {
                out.push(h * 16 + l);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).to_ascii_lowercase()
}

/// Which query parameters of a signed URL are dropped from the key.
///
/// Only when the URL is actually signed: a plain `?expires=1` is kept, but
/// an S3/GCS presigned URL loses every `X-Amz-*`/`X-Goog-*` parameter, a
/// CloudFront signed URL its `Signature`, `Policy`, `Key-Pair-Id` and
/// `Expires`, an Azure SAS URL its `sig`, `se`, `st`. `X-Amz-Security-Token`
/// and `access_token` are dropped always.
fn secret_filter(names: &[String]) -> impl Fn(&str) -> bool {
    let has = |n: &str| names.iter().any(|x| x == n);
    let amz = has("x-amz-signature");
    let goog = has("x-goog-signature");
    let cloudfront = has("signature") && (has("key-pair-id") || has("policy"));
    let azure = has("sig") && has("sv");
    move |name: &str| {
        name == "x-amz-security-token"
            || name == "access_token"
            || (amz && name.starts_with("x-amz-"))
            || (goog && name.starts_with("x-goog-"))
            || (cloudfront && matches!(name, "signature" | "policy" | "key-pair-id" | "expires"))
            || (azure && matches!(name, "sig" | "se" | "st"))
    }
}

/// Whether `query` carries any parameter [`norm_query`] would drop.
pub fn query_has_secrets(query: &str) -> bool {
    let names: Vec<String> = query
        .split('&')
        .map(|p| decode_name(p.split('=').next().unwrap_or("")))
        .collect();
    let secret = secret_filter(&names);
    names.iter().any(|n| secret(n))
}

/// Normalise a query: escapes as in [`norm_pct`], signed-URL parameters
/// dropped, parameters stably sorted by name.
pub fn norm_query(q: &str) -> String {
    if q.is_empty() {
        return String::new();
    }
    let parts: Vec<&str> = q.split('&').collect();
    let names: Vec<String> = parts
        .iter()
        .map(|p| decode_name(p.split('=').next().unwrap_or("")))
        .collect();
    let secret = secret_filter(&names);
    let mut kept: Vec<(String, String)> = parts
        .iter()
        .zip(&names)
        .filter(|(_, n)| !secret(n))
        .map(|(p, _)| {
            let np = norm_pct(p);
            let name = np.split('=').next().unwrap_or("").to_string();
            (name, np)
        })
        .collect();
    kept.sort_by(|a, b| a.0.cmp(&b.0));
    kept.into_iter()
        .map(|(_, p)| p)
        .collect::<Vec<_>>()
        .join("&")
}

/// Rewrite a `Location` value for the lock: userinfo and signed-URL
/// parameters removed. Relative references keep their form.
pub fn sanitize_location(loc: &str) -> String {
    if loc.contains("://") {
        if let Ok(u) = NormUrl::parse(loc) {
            return u.to_string();
        }
    }
    match loc.split_once('?') {
        Some((p, q)) if query_has_secrets(q) => {
            let q = q.split('#').next().unwrap_or("");
            let nq = norm_query(q);
            if nq.is_empty() {
                p.to_string()
            } else {
                format!("{p}?{nq}")
            }
        }
        _ => loc.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(u: &str) -> String {
        NormUrl::parse(u)
            .map(|u| u.to_string())
            .unwrap_or_else(|e| format!("ERR {e}"))
    }

    #[test]
    fn normalisation_rules() {
        assert_eq!(n("HTTP://Example.COM:80/a"), "http://example.com/a");
        assert_eq!(n("https://example.com:443"), "https://example.com/");
        assert_eq!(
            n("https://example.com:8443/x"),
            "https://example.com:8443/x"
        );
        assert_eq!(n("http://h/a?b=2&a=1&b=1"), "http://h/a?a=1&b=2&b=1");
        assert_eq!(n("http://h/%7Euser/%41"), "http://h/~user/A");
        assert_eq!(n("http://h/a%2fb"), "http://h/a%2Fb");
        assert_ne!(n("http://h/a%2Fb"), n("http://h/a/b"));
        assert_ne!(n("http://h/a?"), n("http://h/a"));
        assert_eq!(n("http://h/a#frag"), "http://h/a");
        assert_eq!(n("http://user:pw@h/a"), "http://h/a");
        assert_eq!(n("http://[::1]:8080/"), "http://[::1]:8080/");
        assert_eq!(n("http://h/a?x=%7e"), "http://h/a?x=~");
    }

    #[test]
    fn signed_urls_lose_their_secrets() {
        let u = n("https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4&X-Amz-Credential=AKIA&X-Amz-Date=1&X-Amz-Expires=60&X-Amz-SignedHeaders=host&X-Amz-Signature=deadbeef&v=2");
        assert_eq!(u, "https://b.s3.amazonaws.com/k?v=2");
        assert_eq!(n("http://h/a?expires=1"), "http://h/a?expires=1");
        assert_eq!(n("http://h/a?sig=1"), "http://h/a?sig=1");
        assert_eq!(n("http://h/a?sv=1&sig=SECRET&se=2"), "http://h/a?sv=1");
        assert_eq!(
            sanitize_location("https://u:p@h/a?X-Amz-Signature=s&X-Amz-Date=d"),
            "https://h/a"
        );
        assert_eq!(sanitize_location("/next?a=1"), "/next?a=1");
    }

    /// Found by fuzz/ (url_normalise): an unbracketed host with a colon
    /// normalised to a bracketed form that did not parse again.
    #[test]
    fn fuzz_regression_unbracketed_colon_host_is_refused() {
        assert!(NormUrl::parse("https://user:p:443/x?X-Am~-Signatur&e=s").is_err());
        assert!(NormUrl::parse("http://a:b/").is_err());
        let u = NormUrl::parse("https://user:p@h:443/x").unwrap();
        assert_eq!(NormUrl::parse(&u.to_string()).unwrap(), u);
        assert!(NormUrl::parse("http://[::1]:8080/").is_ok());
    }

    /// Found by fuzz/ (url_normalise): a stray `%` before an escaped hex
    /// digit made a new escape, so a second normalisation changed the URL.
    #[test]
    fn fuzz_regression_stray_percent_before_escaped_hex_digit_is_idempotent() {
        for raw in [
            "https://h:8447/%%641%zz?",
            "http://h/%4%31",
            "http://h/%%41",
        ] {
            let once = NormUrl::parse(raw).unwrap().to_string();
            let twice = NormUrl::parse(&once).unwrap().to_string();
            assert_eq!(once, twice, "{raw}");
        }
        assert_eq!(norm_pct("%7euser"), "~user");
    }
}
