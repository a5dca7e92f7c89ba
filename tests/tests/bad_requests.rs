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
