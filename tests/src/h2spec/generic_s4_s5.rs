//! h2spec `generic/` sections 4 and 5: plain request methods, trailers,
//! and every HPACK representation (RFC 7541 appendix C's literals), each
//! answered normally.

use super::conn::{Conn, field};
use super::frame::Headers;
use super::hpack::table_size_update;
use super::{Case, Verdict, group, verify};

/// A GET on stream 1 whose block is `before`, the encoded common headers,
/// then `after`; the server must answer.
fn get_with(c: &mut Conn, before: &[u8], after: &[u8]) -> Verdict {
    c.handshake()?;
    let mut block = before.to_vec();
    block.extend(c.encode(&c.common_headers()));
    block.extend_from_slice(after);
    c.write_headers(Headers {
        stream: 1,
        block,
        end_stream: true,
        end_headers: true,
        ..Default::default()
    });
    verify::headers_frame(c, 1)
}

pub(crate) fn register(all: &mut Vec<Case>) {
    group(all, "generic/4")
        .case("Sends a GET request", |c| get_with(c, &[], &[]))
        .case("Sends a HEAD request", |c| {
            c.handshake()?;
            let mut fields = c.common_headers();
            fields[0].1 = "HEAD".into();
            c.headers(1, &fields, true, true);
            verify::headers_frame(c, 1)
        })
        .case("Sends a POST request", |c| {
            c.handshake()?;
            let fields = c.post_headers();
            c.headers(1, &fields, false, true);
            c.write_data(1, true, b"test");
            verify::headers_frame(c, 1)
        })
        .case("Sends a POST request with trailers", |c| {
            c.handshake()?;
            let mut fields = c.post_headers();
            fields.push(field("trailer", "x-test"));
            c.headers(1, &fields, false, true);
            c.write_data(1, false, b"test");
            c.headers(1, &[field("x-test", "ok")], true, true);
            verify::headers_frame(c, 1)
        });

    // "user-agent: h2spec" and "x-test: h2spec" in each representation;
    // the Huffman-coded ones from RFC 7541 appendix C.
    group(all, "generic/5")
        .case("Sends a indexed header field representation", |c| {
            get_with(c, &[], b"\xba")
        })
        .case(
            "Sends a literal header field with incremental indexing - indexed name",
            |c| get_with(c, &[], b"\x40\x87\xb5\x05\xb1\x61\xcc\x5a\x93\x84\x9c\x48\xac\xa4"),
        )
        .case(
            "Sends a literal header field with incremental indexing - indexed name (with Huffman coding)",
            |c| get_with(c, &[], b"\x40\x0auser-agent\x06h2spec"),
        )
        .case(
            "Sends a literal header field with incremental indexing - new name",
            |c| get_with(c, &[], b"\x40\x06x-test\x06h2spec"),
        )
        .case(
            "Sends a literal header field with incremental indexing - new name (with Huffman coding)",
            |c| get_with(c, &[], b"\x40\x85\xf2\xb2\x4a\x84\xff\x84\x9c\x48\xac\xa4"),
        )
        .case(
            "Sends a literal header field without indexing - indexed name",
            |c| get_with(c, &[], b"\x00\x0auser-agent\x06h2spec"),
        )
        .case(
            "Sends a literal header field without indexing - indexed name (with Huffman coding)",
            |c| get_with(c, &[], b"\x00\x87\xb5\x05\xb1\x61\xcc\x5a\x93\x84\x9c\x48\xac\xa4"),
        )
        .case(
            "Sends a literal header field without indexing - new name",
            |c| get_with(c, &[], b"\x00\x06x-test\x06h2spec"),
        )
        .case(
            "Sends a literal header field without indexing - new name (huffman encoded)",
            |c| get_with(c, &[], b"\x00\x85\xf2\xb2\x4a\x84\xff\x84\x9c\x48\xac\xa4"),
        )
        .case(
            "Sends a literal header field never indexed - indexed name",
            |c| get_with(c, &[], b"\x10\x0auser-agent\x06h2spec"),
        )
        .case(
            "Sends a literal header field never indexed - indexed name (huffman encoded)",
            |c| get_with(c, &[], b"\x10\x87\xb5\x05\xb1\x61\xcc\x5a\x93\x84\x9c\x48\xac\xa4"),
        )
        .case("Sends a literal header field never indexed - new name", |c| {
            get_with(c, &[], b"\x10\x85\xf2\xb2\x4a\x84\xff\x84\x9c\x48\xac\xa4")
        })
        .case(
            "Sends a literal header field never indexed - new name (huffman encoded)",
            |c| get_with(c, &[], b"\x10\x85\xf2\xb2\x4a\x84\xff\x84\x9c\x48\xac\xa4"),
        )
        .case("Sends a dynamic table size update", |c| {
            // h2spec's encoder announces its smaller table itself.
            c.set_max_dynamic_table_size(128);
            get_with(c, &table_size_update(128), &[])
        })
        .case("Sends multiple dynamic table size update", |c| {
            get_with(c, b"\x3f\x61\x3f\xe1\x1f", &[])
        });
}
