//! `NodeRecord::from_json` on arbitrary bytes (issue 12): never panics, and
//! a record it accepts is valid and its `to_json` is accepted again. The
//! CI-sized property test of the same is proto/tests/registry_props.rs.
#![no_main]

use infermesh_proto::registry::NodeRecord;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    // The first byte picks where the znode name ends and the record begins.
    let at = usize::from(split).min(rest.len());
    let (id, bytes) = rest.split_at(at);
    let Ok(id) = std::str::from_utf8(id) else {
        return;
    };
    if let Ok(record) = NodeRecord::from_json(bytes, id) {
        assert_eq!(record.node_id, id);
        let _ = record.grpc_addr();
        assert!(NodeRecord::from_json(&record.to_json(), id).is_ok());
    }
});
