//! `NodeRecord::from_json` on hostile input: arbitrary bytes never panic
//! (and anything accepted is valid), every valid record round-trips, and a
//! valid record with unknown fields added parses to the same record.

use infermesh_proto::registry::{
    Capacity, Endpoints, MAX_RECORD_BYTES, ModelEntry, NodeRecord, NodeState, RecordError, SCHEMA,
    valid_name,
};
use proptest::prelude::*;

fn state() -> impl Strategy<Value = NodeState> {
    prop_oneof![
        Just(NodeState::Serving),
        Just(NodeState::Draining),
        Just(NodeState::Degraded)
    ]
}

/// Non-negative numbers that JSON carries exactly (no last-bit rounding).
fn exact() -> impl Strategy<Value = f64> {
    (0u32..100_000_000).prop_map(|n| f64::from(n) / 1024.0)
}

fn record() -> impl Strategy<Value = NodeRecord> {
    (
        "[a-zA-Z0-9_-]{1,40}",
        ".{0,20}",
        state(),
        exact(),
        (".{0,20}", 0u32..64, exact()),
        (any::<[u8; 4]>(), 1u16..),
        proptest::option::of("[a-z0-9.:]{1,30}"),
        proptest::collection::vec((".{0,16}", any::<bool>()), 0..8),
        any::<u64>(),
    )
        .prop_map(
            |(
                node_id,
                zone,
                state,
                weight,
                (gpu_model, gpu_count, score),
                (ip, port),
                rdma,
                models,
                updated_ms,
            )| {
                NodeRecord {
                    schema: SCHEMA,
                    node_id,
                    zone,
                    host: "h".into(),
                    version: "1".into(),
                    state,
                    weight,
                    capacity: Capacity {
                        gpu_model,
                        gpu_count,
                        score,
                    },
                    endpoints: Endpoints {
                        grpc: format!("{}:{port}", std::net::Ipv4Addr::from(ip)),
                        admin: String::new(),
                        rdma,
                        ..Default::default()
                    },
                    models: models
                        .into_iter()
                        .map(|(name, ready)| ModelEntry { name, ready })
                        .collect(),
                    updated_ms,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512), id in "[a-z0-9-]{1,8}") {
        if let Ok(r) = NodeRecord::from_json(&bytes, &id) {
            prop_assert_eq!(r.schema, SCHEMA);
            prop_assert_eq!(&r.node_id, &id);
            prop_assert!(valid_name(&r.node_id));
            prop_assert!(r.weight.is_finite() && r.weight >= 0.0);
            // Validated on read: never panics.
            let _ = r.grpc_addr();
        }
    }

    #[test]
    fn mutated_records_never_panic(r in record(), at in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let mut bytes = r.to_json();
        let i = at.index(bytes.len());
        bytes[i] = byte;
        let _ = NodeRecord::from_json(&bytes, &r.node_id);
        bytes.truncate(i);
        let _ = NodeRecord::from_json(&bytes, &r.node_id);
    }

    #[test]
    fn valid_records_round_trip(r in record()) {
        let bytes = r.to_json();
        prop_assert!(bytes.len() <= MAX_RECORD_BYTES);
        prop_assert_eq!(NodeRecord::from_json(&bytes, &r.node_id), Ok(r));
    }

    #[test]
    fn unknown_fields_are_ignored(r in record(), key in "x_[a-z]{1,10}", value in any::<i64>()) {
        let mut v: serde_json::Value = serde_json::from_slice(&r.to_json()).unwrap();
        v[&key] = serde_json::json!({ "nested": value });
        v["capacity"][&key] = serde_json::json!(value);
        let bytes = serde_json::to_vec(&v).unwrap();
        prop_assert_eq!(NodeRecord::from_json(&bytes, &r.node_id), Ok(r));
    }

    #[test]
    fn other_schemas_are_refused(r in record(), schema in any::<u32>()) {
        prop_assume!(schema != SCHEMA);
        let mut v: serde_json::Value = serde_json::from_slice(&r.to_json()).unwrap();
        v["schema"] = serde_json::json!(schema);
        let bytes = serde_json::to_vec(&v).unwrap();
        prop_assert_eq!(NodeRecord::from_json(&bytes, &r.node_id), Err(RecordError::Schema(schema)));
    }
}
