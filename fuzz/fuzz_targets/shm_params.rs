//! The shared-memory parameters of every tensor of a request decoded from
//! arbitrary bytes: parsing must not panic, and an accepted reference has
//! a non-negative offset and size that fit in an int64.
#![no_main]

use infermesh_proto::inference::ModelInferRequest;
use infermesh_transport::shm::ShmRef;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Ok(req) = ModelInferRequest::decode(data) else {
        return;
    };
    let params = req
        .inputs
        .iter()
        .map(|i| (&i.name, &i.parameters))
        .chain(req.outputs.iter().map(|o| (&o.name, &o.parameters)));
    for (name, p) in params {
        if let Ok(Some(r)) = ShmRef::from_params(name, p) {
            assert!(r.offset <= i64::MAX as u64 && r.byte_size <= i64::MAX as u64);
        }
    }
});
