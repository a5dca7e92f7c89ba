//! A request's header block, and a request's trailers, checked against
//! HTTP/2's rules for requests (RFC 9113 8.1, 8.2, 8.3) as they decode.

use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri, Version};

use crate::fields;
use crate::limits::MAX_HEADER_FIELDS;

/// Why a request head was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Over the header list limit (answered with RESOURCE_EXHAUSTED).
    TooLarge,
    /// Broke HTTP/2's rules for requests (the stream is reset).
    Malformed,
}

/// A request head as it is decoded.
#[derive(Default)]
pub(crate) struct RequestHead {
    method: Option<Method>,
    path: Option<Uri>,
    scheme: bool,
    authority: bool,
    headers: HeaderMap,
    content_length: Option<u64>,
    size: usize,
    fields: usize,
    too_large: bool,
    malformed: bool,
}

impl RequestHead {
    /// Takes one decoded field; `limit` is the header list limit, `known`
    /// the paths parsed once per connection.
    pub(crate) fn field(&mut self, name: &[u8], value: &[u8], limit: usize, known: &[Uri]) {
        self.fields += 1;
        self.size += name.len() + value.len() + 32;
        if self.size > limit || self.fields > MAX_HEADER_FIELDS {
            self.too_large = true;
        }
        if self.too_large || self.malformed {
            return;
        }
        if let Some(pseudo) = name.strip_prefix(b":") {
            if !self.headers.is_empty() || self.content_length.is_some() {
                // Pseudo-headers come first (8.3).
                self.malformed = true;
                return;
            }
            match pseudo {
                b"method" if self.method.is_none() => match value {
                    b"POST" => self.method = Some(Method::POST),
                    _ => match Method::from_bytes(value) {
                        Ok(m) => self.method = Some(m),
                        Err(_) => self.malformed = true,
                    },
                },
                b"path" if self.path.is_none() => {
                    // A known path is cloned: parsing is most of the cost.
                    let uri = match known.iter().find(|u| u.path().as_bytes() == value) {
                        Some(u) => Ok(u.clone()),
                        None => Uri::try_from(value),
                    };
                    match uri {
                        Ok(u) if u.scheme().is_none() && value.first() == Some(&b'/') => {
                            self.path = Some(u)
                        }
                        _ => self.malformed = true,
                    }
                }
                b"scheme" if !self.scheme => self.scheme = true,
                b"authority" if !self.authority => self.authority = true,
                // Unknown, repeated, or a response's (`:status`).
                _ => self.malformed = true,
            }
            return;
        }
        if !regular_field_is_allowed(name, value) {
            self.malformed = true;
            return;
        }
        if name == b"content-length" {
            // One value of digits only (RFC 9110 8.6); kept out of the map,
            // which the agent forwards.
            match parse_length(value) {
                Some(n) if self.content_length.is_none_or(|c| c == n) => {
                    self.content_length = Some(n)
                }
                _ => self.malformed = true,
            }
            return;
        }
        match (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
            (Ok(n), Ok(v)) if n.as_str().as_bytes() == name => {
                self.headers.append(n, v);
            }
            // Upper case names are malformed in HTTP/2.
            _ => self.malformed = true,
        }
    }

    /// The request, and the body length it announced.
    pub(crate) fn into_request(self) -> Result<(Request<()>, Option<u64>), Refusal> {
        if self.too_large {
            return Err(Refusal::TooLarge);
        }
        let (Some(method), Some(path), true, false) =
            (self.method, self.path, self.scheme, self.malformed)
        else {
            return Err(Refusal::Malformed);
        };
        let mut req = Request::new(());
        *req.method_mut() = method;
        *req.uri_mut() = path;
        *req.version_mut() = Version::HTTP_2;
        *req.headers_mut() = self.headers;
        Ok((req, self.content_length))
    }
}

/// A request's trailers as they decode: malformed when they hold a
/// pseudo-header (8.1) or a field HTTP/2 forbids. Their values are not
/// kept: no request the agent serves reads them.
#[derive(Default)]
pub(crate) struct Trailers {
    pub(crate) malformed: bool,
}

impl Trailers {
    pub(crate) fn field(&mut self, name: &[u8], value: &[u8]) {
        if name.first() == Some(&b':')
            || !regular_field_is_allowed(name, value)
            || name.iter().any(u8::is_ascii_uppercase)
        {
            self.malformed = true;
        }
    }
}

/// A regular field HTTP/2 allows in a request: not connection-specific,
/// and `te` only as `trailers` (8.2.2).
fn regular_field_is_allowed(name: &[u8], value: &[u8]) -> bool {
    !fields::connection_specific_bytes(name) && (name != b"te" || value == b"trailers")
}

/// A `content-length` value: ASCII digits, no sign, no list.
fn parse_length(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(fields: &[(&str, &str)]) -> Result<(Request<()>, Option<u64>), Refusal> {
        let mut head = RequestHead::default();
        for (n, v) in fields {
            head.field(n.as_bytes(), v.as_bytes(), 16 << 10, &[]);
        }
        head.into_request()
    }

    const BASE: [(&str, &str); 3] = [(":method", "POST"), (":scheme", "http"), (":path", "/m")];

    #[test]
    fn a_request_needs_each_pseudo_header_once_and_first() {
        assert!(head(&BASE).is_ok());
        for missing in 0..3 {
            let mut f = BASE.to_vec();
            f.remove(missing);
            assert_eq!(head(&f).err(), Some(Refusal::Malformed), "{f:?}");
        }
        for extra in [
            (":method", "GET"),
            (":path", "/x"),
            (":scheme", "https"),
            (":status", "200"),
            (":foo", "x"),
        ] {
            let mut f = BASE.to_vec();
            f.push(extra);
            assert_eq!(head(&f).err(), Some(Refusal::Malformed), "{extra:?}");
        }
        let mut f = vec![("x-a", "1")];
        f.extend(BASE);
        assert_eq!(
            head(&f).err(),
            Some(Refusal::Malformed),
            "pseudo after regular"
        );
        let mut f = BASE.to_vec();
        f[2] = (":path", "");
        assert_eq!(head(&f).err(), Some(Refusal::Malformed), "empty path");
    }

    #[test]
    fn connection_fields_upper_case_and_bad_lengths_are_malformed() {
        for bad in [
            ("connection", "keep-alive"),
            ("te", "gzip"),
            ("X-Upper", "1"),
            ("content-length", "-1"),
            ("content-length", "1,1"),
            ("content-length", ""),
        ] {
            let mut f = BASE.to_vec();
            f.push(bad);
            assert_eq!(head(&f).err(), Some(Refusal::Malformed), "{bad:?}");
        }
        let mut f = BASE.to_vec();
        f.push(("te", "trailers"));
        f.push(("content-length", "12"));
        let (req, length) = head(&f).unwrap();
        assert_eq!(length, Some(12));
        assert!(!req.headers().contains_key("content-length"));
        assert_eq!(req.headers()["te"], "trailers");
    }

    #[test]
    fn trailers_may_not_hold_pseudo_or_connection_fields() {
        for (name, bad) in [
            ("grpc-x", false),
            (":path", true),
            ("connection", true),
            ("X-Up", true),
        ] {
            let mut t = Trailers::default();
            t.field(name.as_bytes(), b"v");
            assert_eq!(t.malformed, bad, "{name}");
        }
    }
}
