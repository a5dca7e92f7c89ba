//! Bad requests get a clear INVALID_ARGUMENT or NOT_FOUND, and the agent
//! keeps serving.

use infermesh_proto::inference::ModelInferRequest;
use infermesh_tests::{Agent, dense, testworker};
use tonic::Code;

#[tokio::test]
async fn bad_requests_are_refused_and_the_agent_keeps_serving() {
    let agent = Agent::builder().worker(testworker("")).start().await;
    let mut client = agent.client().await;
    let good = dense::request(&dense::input(2, 9), true);

    let mut cases: Vec<(&str, ModelInferRequest, Code, &str)> = Vec::new();
    let mut unknown_model = good.clone();
    unknown_model.model_name = "no-such-model".into();
    cases.push((
        "unknown model",
        unknown_model,
        Code::NotFound,
        "no-such-model",
    ));

    let mut no_model = good.clone();
    no_model.model_name.clear();
    cases.push((
        "empty model name",
        no_model,
        Code::InvalidArgument,
        "model_name",
    ));

    let mut wrong_shape = good.clone();
    wrong_shape.inputs[0].shape = vec![2, 15];
    cases.push(("wrong shape", wrong_shape, Code::InvalidArgument, "shape"));

    let mut wrong_rank = good.clone();
    wrong_rank.inputs[0].shape = vec![32];
    cases.push(("wrong rank", wrong_rank, Code::InvalidArgument, "shape"));

    let mut short_bytes = good.clone();
    short_bytes.raw_input_contents[0] = short_bytes.raw_input_contents[0].slice(..100);
    cases.push((
        "byte size not shape x dtype",
        short_bytes,
        Code::InvalidArgument,
        "bytes",
    ));

    let mut wrong_dtype = good.clone();
    wrong_dtype.inputs[0].datatype = "INT32".into();
    cases.push((
        "wrong datatype",
        wrong_dtype,
        Code::InvalidArgument,
        "datatype",
    ));

    let mut unknown_dtype = good.clone();
    unknown_dtype.inputs[0].datatype = "FLOAT128".into();
    cases.push((
        "unknown datatype",
        unknown_dtype,
        Code::InvalidArgument,
        "datatype",
    ));

    let mut wrong_input = good.clone();
    wrong_input.inputs[0].name = "INPUT9".into();
    cases.push((
        "unknown input",
        wrong_input,
        Code::InvalidArgument,
        "INPUT9",
    ));

    let mut typed_count = dense::request(&dense::input(2, 9), false);
    typed_count.inputs[0]
        .contents
        .as_mut()
        .unwrap()
        .fp32_contents
        .pop();
    cases.push((
        "typed element count",
        typed_count,
        Code::InvalidArgument,
        "elements",
    ));

    let mut both = good.clone();
    both.inputs[0].contents = dense::request(&dense::input(2, 9), false).inputs[0]
        .contents
        .clone();
    cases.push((
        "raw and typed together",
        both,
        Code::InvalidArgument,
        "contents",
    ));

    let mut huge = good.clone();
    huge.inputs[0].shape = vec![i64::MAX / 2, 16];
    cases.push(("overflowing shape", huge, Code::InvalidArgument, "large"));

    for (what, req, code, needle) in cases {
        let err = client.model_infer(req).await.expect_err(what);
        assert_eq!(err.code(), code, "{what}: {}", err.message());
        assert!(
            err.message().contains(needle),
            "{what}: message '{}' should mention '{needle}'",
            err.message()
        );
        // The agent keeps serving after every bad request.
        let ok = client
            .model_infer(good.clone())
            .await
            .unwrap_or_else(|e| panic!("after {what}: {e}"));
        assert_eq!(
            dense::output(ok.get_ref()).0,
            dense::forward(&dense::input(2, 9))
        );
    }
    let status = agent.status().await;
    assert!(status.workers.iter().all(|w| w.state == "ready"));
}

/// A request larger than one HTTP/2 DATA frame is checked where it lies
/// (the agent reads its fields and the tensors' sizes without gathering the
/// frames, issue 27): a good one is answered right, raw or typed; a bad size,
/// shape or datatype is refused as a one-frame request would be, and the
/// agent keeps serving.
#[tokio::test]
async fn requests_in_many_frames_are_checked_and_answered() {
    let agent = Agent::builder().worker(testworker("")).start().await;
    let mut client = agent.client().await;
    // 4,096 rows × 16 FP32: 256 KiB, sixteen DATA frames and more.
    let input = dense::input(4096, 3);
    for raw in [true, false] {
        let ok = client
            .model_infer(dense::request(&input, raw))
            .await
            .unwrap_or_else(|e| panic!("raw {raw}: {e}"));
        assert_eq!(dense::output(ok.get_ref()).0, dense::forward(&input));
    }
    let good = dense::request(&input, true);
    let mut cases: Vec<(&str, ModelInferRequest, &str)> = Vec::new();
    let mut short = good.clone();
    short.raw_input_contents[0] = short.raw_input_contents[0].slice(4..);
    cases.push(("byte size not shape x dtype", short, "bytes"));
    let mut extra = good.clone();
    extra.raw_input_contents.push(vec![0u8; 64].into());
    cases.push(("more raw contents than inputs", extra, "raw"));
    let mut wrong_shape = good.clone();
    wrong_shape.inputs[0].shape = vec![4096, 15];
    cases.push(("wrong shape", wrong_shape, "shape"));
    let mut as_bytes = good.clone();
    as_bytes.inputs[0].datatype = "BYTES".into();
    cases.push(("BYTES where FP32 is served", as_bytes, "datatype"));
    for (what, req, needle) in cases {
        let err = client.model_infer(req).await.expect_err(what);
        assert_eq!(
            err.code(),
            Code::InvalidArgument,
            "{what}: {}",
            err.message()
        );
        assert!(
            err.message().contains(needle),
            "{what}: message '{}' should mention '{needle}'",
            err.message()
        );
        let ok = client
            .model_infer(good.clone())
            .await
            .unwrap_or_else(|e| panic!("after {what}: {e}"));
        assert_eq!(dense::output(ok.get_ref()).0, dense::forward(&input));
    }
}
