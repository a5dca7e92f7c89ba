//! Replays one fuzz input (a file of bytes, or hex in `HARNESS_INPUT`)
//! through a harness: `HARNESS_TRACE=1 HARNESS_INPUT=path cargo test -p
//! infermesh-http2 --test replay -- --ignored --nocapture`; the role is
//! `HARNESS_ROLE` (`server`, `client` or `hpack`).

mod harness;

#[test]
#[ignore = "replays a file named by HARNESS_INPUT"]
fn replay() {
    let path = std::env::var("HARNESS_INPUT").expect("HARNESS_INPUT");
    let data = std::fs::read(&path).unwrap_or_else(|_| {
        // A proptest `data = [1, 2, ...]` list.
        let text = path;
        text.split(|c: char| !c.is_ascii_digit())
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<u8>().unwrap())
            .collect()
    });
    match std::env::var("HARNESS_ROLE").as_deref() {
        Ok("client") => harness::client::Run::run(&data),
        Ok("hpack") => harness::hpack_block::differential(&data),
        _ => harness::server::Run::run(&data),
    }
}
